//go:build linux

package main

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
)

// TestDNSSideDoors: through the real gateway, an agent in open mode can
// reach neither a public DNS-over-HTTPS resolver (by name or by address)
// nor DNS over TLS, nor a deny entry; the log says why each time.
func TestDNSSideDoors(t *testing.T) {
	w := requireWorld(t)
	require.NoError(t, w.cli(io.Discard, "policy", "set", "bob", "--mode", "open", "--allow", "!evil.example.org"))
	for _, tc := range []struct{ what, script string }{
		{"a DoH resolver by name", "curl -sS --max-time 5 https://dns.google/dns-query"},
		{"a DoH resolver by address", "curl -sS --max-time 5 -k https://1.1.1.1/dns-query"},
		{"DNS over TLS", "curl -sS --max-time 5 -k https://www.example.com:853/"},
		{"a deny entry", "curl -sS --max-time 5 https://evil.example.org/"},
		{"resolving a DoH resolver", "getent hosts dns.google"},
		{"a DoH resolver's address, transparently", "curl -sS --max-time 5 --noproxy '*' -k https://8.8.8.8/dns-query"},
	} {
		out, err := w.inSandbox("bob", tc.script)
		assert.Error(t, err, "%s: %s", tc.what, out)
	}
	out, err := w.inSandbox("bob", "curl -sS --max-time 5 http://www.example.com/")
	require.NoError(t, err, "open mode still reaches the rest: %s", out)

	var log strings.Builder
	require.NoError(t, w.cli(&log, "log", "--agent", "bob", "--denied", "--json", "--limit", "0"))
	for _, want := range []string{
		`"kind":"dns","host":"dns.google"`, // its name does not resolve
		`"host":"1.1.1.1","port":443,"target":"1.1.1.1:443","status":403,"allowed":false,"reason":"` + policy.ReasonDoH + `"`,
		`"kind":"tls","host":"8.8.8.8","port":443,"allowed":false,"reason":"` + policy.ReasonDoH + `"`,
		`"reason":"` + policy.ReasonDoT + `"`,
		`"reason":"` + policy.ReasonDenyEntry + `","rule":"!evil.example.org"`,
	} {
		assert.Contains(t, log.String(), want)
	}
}
