package tproxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"

	"github.com/agenthold/egress/egresslog"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
)

// TestNameRefusedOutrightStaysRefused: a name refused by a deny entry, as
// a DNS-over-HTTPS resolver or on the DNS-over-TLS port is not let through
// by the address it is sent to, however broadly addresses are allowed;
// a name no entry lists still falls back to its address.
func TestNameRefusedOutrightStaysRefused(t *testing.T) {
	dst := netip.MustParseAddrPort("198.51.100.7:443")
	for _, tc := range []struct {
		name   string
		cfg    policy.Config
		host   string
		port   uint16
		reason string
	}{
		{"open, deny entry", policy.Config{Mode: policy.Open, Allow: []string{"!evil.example.org"}}, "evil.example.org", 443, policy.ReasonDenyEntry},
		{"*, deny entry", policy.Config{Allow: []string{"*", "!evil.example.org"}}, "evil.example.org", 443, policy.ReasonDenyEntry},
		{"address prefix, deny entry", policy.Config{Allow: []string{"198.51.100.0/24:*", "!evil.example.org"}}, "evil.example.org", 443, policy.ReasonDenyEntry},
		{"open, DoH resolver on another address", policy.Config{Mode: policy.Open}, "cloudflare-dns.com", 443, policy.ReasonDoH},
		{"address prefix, DoT", policy.Config{Allow: []string{"198.51.100.0/24:*"}}, "dot.example.net", 853, policy.ReasonDoT},
	} {
		pol, err := policy.New(tc.cfg)
		require.NoError(t, err, tc.name)
		_, d := decide(pol, tc.host, netip.AddrPortFrom(dst.Addr(), tc.port))
		assert.False(t, d.Allowed, "%s: allowed by its address", tc.name)
		assert.Equal(t, tc.reason, d.Reason, tc.name)
	}
	pol, err := policy.New(policy.Config{Allow: []string{"198.51.100.0/24:443"}})
	require.NoError(t, err)
	_, d := decide(pol, "unlisted.example", dst)
	assert.True(t, d.Allowed, "a name no entry lists does not fall back to its allowed address: %+v", d)
}

// TestResolvedAddressDenied: an allowed name whose address a deny entry
// covers is refused when the gateway dials it, transparently, through a
// CONNECT and in plain HTTP, and the record says which entry.
func TestResolvedAddressDenied(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "!127.0.0.2"}, nil)
	_, err := w.httpsGet(w.tlsAddr, "api.test")
	require.Error(t, err, "reached an address a deny entry covers, by name")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.test" && !r.Allowed })
	assert.Contains(t, r.Reason, policy.ReasonDenyEntry, "record %+v", r)
	assert.Contains(t, r.Reason, "127.0.0.2", "record %+v", r)
}

// TestResolvedAddressDeniedOverPlainHTTP: a plain HTTP request to an
// allowed name whose address a deny entry covers is a denial: 403 with a
// Proxy-Status that says why, and a record that is not allowed and names
// the entry, transparently and through the explicit proxy.
func TestResolvedAddressDeniedOverPlainHTTP(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "!127.0.0.2"}, nil)
	check := func(t *testing.T, resp *http.Response) {
		t.Helper()
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("Proxy-Status"), "error=destination_ip_prohibited")
		assert.Contains(t, resp.Header.Get("Proxy-Status"), policy.ReasonDenyEntry)
		r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Status == http.StatusForbidden })
		assert.False(t, r.Allowed, "record %+v", r)
		assert.Equal(t, "!127.0.0.2", r.Rule, "record %+v", r)
	}
	t.Run("transparent", func(t *testing.T) {
		c := w.dial(w.httpAddr)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		check(t, resp)
	})
	t.Run("explicit", func(t *testing.T) {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		fmt.Fprintf(c, "GET http://api.test:%d/ HTTP/1.1\r\nHost: api.test\r\n\r\n", w.httpAddr.Port())
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		check(t, resp)
	})
}
