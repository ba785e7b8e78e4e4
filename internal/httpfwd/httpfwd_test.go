package httpfwd

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHostOnly(t *testing.T) {
	for in, want := range map[string]string{
		"example.com":      "example.com",
		"example.com:8080": "example.com",
		"[::1]:443":        "::1",
		"[::1]":            "::1",
		"[::1":             "[::1", // malformed: left to be judged invalid
		"::1]":             "::1]",
		"":                 "",
	} {
		assert.Equal(t, want, HostOnly(in), in)
	}
}

// TestDescribe keeps the URL (whose query may carry an injected secret)
// out of every description, and tells refusals and certificate errors
// apart from network faults.
func TestDescribe(t *testing.T) {
	const secret = "sk-live-never-in-an-error"
	ts := NewTransports(Config{})
	c := &http.Client{Transport: ts.For(false)}

	_, err := c.Get("http://127.0.0.1:9/?key=" + secret)
	require.Error(t, err)
	f := Describe(err)
	assert.NotContains(t, f.Why, secret)
	assert.True(t, f.Refused, "loopback is refused by netguard: %s", f.Why)
	assert.False(t, f.Certificate)

	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	trusting := NewTransports(Config{HTTP2: true})
	trusting.For(true).DialContext = nil // a plain dial: the test server is on loopback
	trusting.For(true).TLSClientConfig = &tls.Config{}
	req, _ := http.NewRequestWithContext(context.Background(), "GET", srv.URL+"/?key="+secret, nil)
	_, err = trusting.For(true).RoundTrip(req)
	require.Error(t, err)
	f = Describe(err)
	assert.True(t, f.Certificate, f.Why)
	assert.True(t, strings.HasPrefix(f.Why, "upstream certificate rejected"), f.Why)
	assert.NotContains(t, f.Why, secret)
}

// TestTransportsNeverUseAnEnvironmentProxy keeps HTTPS_PROXY in the
// gateway's own environment from redirecting what it forwards.
func TestTransportsNeverUseAnEnvironmentProxy(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://198.18.0.1:3128")
	t.Setenv("HTTPS_PROXY", "http://198.18.0.1:3128")
	ts := NewTransports(Config{})
	for _, tr := range ts.t {
		assert.Nil(t, tr.Proxy)
		assert.True(t, tr.DisableCompression)
		assert.Equal(t, DefaultResponseHeaderTimeout, tr.ResponseHeaderTimeout)
	}
}

func TestIsDoH(t *testing.T) {
	req := func(method, target string, header http.Header) *http.Request {
		r := httptest.NewRequest(method, target, nil)
		for k, v := range header {
			r.Header[k] = v
		}
		return r
	}
	for _, tc := range []struct {
		name string
		r    *http.Request
		doh  bool
	}{
		{"RFC 8484 POST", req("POST", "/dns-query", http.Header{"Content-Type": {"application/dns-message"}}), true},
		{"RFC 8484 GET", req("GET", "/dns-query?dns=AAABAAABAAAAAAAAA3d3dwdleGFtcGxlA2NvbQAAAQAB", nil), true},
		{"GET, asking for a DNS message", req("GET", "/q", http.Header{"Accept": {"text/html, application/dns-message;q=0.9"}}), true},
		{"JSON, asked for", req("GET", "/resolve?name=example.com", http.Header{"Accept": {"application/dns-json"}}), true},
		{"JSON, by ct", req("GET", "/resolve?name=example.com&ct=application/dns-json", nil), true},
		{"JSON GET form", req("GET", "/resolve?name=example.com&type=A", nil), true},
		{"the draft's type", req("POST", "/", http.Header{"Content-Type": {"application/dns-udpwireformat"}}), true},
		{"x- type", req("POST", "/", http.Header{"Content-Type": {"application/x-dns-message"}}), true},
		{"a second Content-Type", req("POST", "/", http.Header{"Content-Type": {"text/plain", "application/dns-message"}}), true},
		{"a second Accept", req("GET", "/", http.Header{"Accept": {"*/*", "application/dns-message"}}), true},
		{"; separates parameters", req("GET", "/q?a=1;dns=AAAB", nil), true},
		{"case and parameters", req("POST", "/", http.Header{"Content-Type": {"Application/DNS-Message; charset=x"}}), true},
		{"name alone, to a resolver's path", req("GET", "/resolve?name=example.com", nil), true},
		{"name alone, to dns-query", req("GET", "/dns-query?name=example.com", nil), true},
		{"octet-stream to dns-query", req("POST", "/dns-query", http.Header{"Content-Type": {"application/octet-stream"}}), true},
		{"dns-query under a prefix", req("POST", "/tenant/a/dns-query/", nil), true},
		{"an ordinary POST", req("POST", "/api", http.Header{"Content-Type": {"application/json"}}), false},
		{"a resolve endpoint without a name", req("GET", "/resolve?id=3", nil), false},
		{"a search for a name", req("GET", "/search?name=alice", nil), false},
		{"a page about DNS", req("GET", "/docs/dns", http.Header{"Accept": {"text/html"}}), false},
	} {
		assert.Equal(t, tc.doh, IsDoH(tc.r), tc.name)
	}
}
