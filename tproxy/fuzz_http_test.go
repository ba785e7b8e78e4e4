package tproxy

import (
	"bufio"
	"bytes"
	"net/http"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
)

// FuzzRequestHead feeds arbitrary request heads, as a transparent
// connection and as the explicit proxy receive them, through the parsing
// and the decision: whatever a request says, what is allowed is only what
// the policy names, and the target dialled is exactly what was judged.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://allowed.test/x HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET http://evil.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://[::ffff:169.254.169.254]/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://2130706433/ HTTP/1.1\r\n\r\n",
		"GET http://ALLOWED.TEST./ HTTP/1.1\r\n\r\n",
		"GET http://allowed.test@evil.test/ HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
		"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	pol, err := policy.New(policy.Config{Allow: []string{"allowed.test:*", "203.0.113.7"}})
	require.NoError(f, err)
	origDst := netip.MustParseAddrPort("198.51.100.1:80")
	f.Fuzz(func(t *testing.T, head []byte, explicit bool) {
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			return
		}
		host, dst, err := httpTarget(r, connFacts{dst: origDst, explicit: explicit})
		if err != nil {
			return
		}
		tg, d := decide(pol, host, dst)
		if !d.Allowed {
			return
		}
		switch {
		case tg.host == "allowed.test":
		case tg.host == "" && tg.addr == netip.MustParseAddr("203.0.113.7"):
			if d.Addr != tg.addr {
				t.Fatalf("dialling %v, judged %v", tg.addr, d.Addr)
			}
		default:
			t.Fatalf("%q (explicit %v) allowed to %q / %v, which the policy does not name", head, explicit, tg.host, tg.addr)
		}
		if explicit && tg.host == "allowed.test" && r.URL.Hostname() == "" {
			t.Fatalf("an explicit request without a URL host was judged on %q", tg.host)
		}
	})
}
