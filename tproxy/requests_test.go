package tproxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// requestEntries let api.test be read under /public/ and nothing be
// deleted on it, on any port (the test servers' ports are random).
var requestEntries = []string{"GET,HEAD api.test:*/public/*", "!DELETE api.test:*/**", "other.test:*"}

type exchange struct {
	method, path string
	status       int
	proxyStatus  string // a part of the Proxy-Status field, for refusals
}

var plainExchanges = []exchange{
	{"GET", "/public/readme", http.StatusOK, ""},
	{"POST", "/public/readme", http.StatusForbidden, policy.ReasonNoRequestRule},
	{"GET", "/public/../admin/keys", http.StatusForbidden, policy.ReasonPathDotSegment},
	{"GET", "/public/..%2Fadmin", http.StatusForbidden, policy.ReasonPathEncodedDots},
	{"DELETE", "/public/readme", http.StatusForbidden, "a deny entry matches: !DELETE api.test:*/**"},
	{"HEAD", "/public//readme;v=2", http.StatusOK, ""},
	{"GET", "/public/readme?x=../../admin", http.StatusOK, ""},
}

// pipeline writes every exchange's request at once on c, then reads the
// answers in order: one connection, each request judged on its own.
func pipeline(t *testing.T, c net.Conn, target func(path string) string, host string, exchanges []exchange) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var out strings.Builder
	for _, x := range exchanges {
		fmt.Fprintf(&out, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", x.method, target(x.path), host)
	}
	_, err := io.WriteString(c, out.String())
	require.NoError(t, err)
	br := bufio.NewReader(c)
	for _, x := range exchanges {
		resp, err := http.ReadResponse(br, &http.Request{Method: x.method})
		require.NoError(t, err, "%s %s", x.method, x.path)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, x.status, resp.StatusCode, "%s %s", x.method, x.path)
		if x.proxyStatus != "" {
			assert.Contains(t, resp.Header.Get("Proxy-Status"), x.proxyStatus, "%s %s", x.method, x.path)
		}
	}
}

// TestRequestEntriesOnPlainHTTP: on the transparent path and as the
// explicit proxy's absolute-form requests, every request of a kept-alive,
// pipelined connection is judged by its method and path, and each
// refusal is recorded with the entry that made it.
func TestRequestEntriesOnPlainHTTP(t *testing.T) {
	w := newWorld(t, requestEntries, nil)
	hostPort := fmt.Sprintf("api.test:%d", w.httpAddr.Port())
	t.Run("transparent", func(t *testing.T) {
		pipeline(t, w.dial(w.httpAddr), func(p string) string { return p }, hostPort, plainExchanges)
	})
	t.Run("explicit", func(t *testing.T) {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		pipeline(t, c, func(p string) string { return "http://" + hostPort + p }, hostPort, plainExchanges)
	})
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Method == "DELETE" })
	assert.False(t, rec.Allowed)
	assert.Equal(t, "!DELETE api.test:*/**", rec.Rule)
	assert.Equal(t, policy.ReasonDenyEntry, rec.Reason)
	assert.Equal(t, "/public/readme", rec.Path)
	rec = w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Method == "GET" && r.Allowed })
	assert.Equal(t, "GET,HEAD api.test:*/public/*", rec.Rule)
}

// claimsNothing is an Interceptor that claims no host: what it is handed,
// it is handed because the policy must see the requests.
type claimsNothing struct{ interceptor }

func (*claimsNothing) Claims(_, _ string) bool { return false }

// TestRequestEntriesNeedTheirRequestsSeen: a host whose requests the
// policy judges one by one is intercepted even though no credential
// claims it; without an Interceptor its TLS is refused, and TCP that is
// neither TLS nor HTTP is refused whatever the name, on every path
// (transparent, a CONNECT tunnel), never spliced unseen.
func TestRequestEntriesNeedTheirRequestsSeen(t *testing.T) {
	t.Run("intercepted", func(t *testing.T) {
		ic := &claimsNothing{}
		w := newWorld(t, requestEntries, func(p *Proxy) { p.Interceptor = ic })
		w.httpsGet(w.tlsAddr, "api.test")
		body, err := w.httpsGet(w.tlsAddr, "other.test")
		require.NoError(t, err, "a host allowed in full is passed through")
		assert.NotEmpty(t, body)
		ic.mu.Lock()
		defer ic.mu.Unlock()
		assert.Equal(t, []string{fmt.Sprintf("a1 api.test:%d", w.tlsAddr.Port())}, ic.hosts)
	})
	t.Run("no interceptor: TLS refused", func(t *testing.T) {
		w := newWorld(t, requestEntries, nil)
		_, err := w.httpsGet(w.tlsAddr, "api.test")
		require.Error(t, err, "TLS to a host whose requests must be judged was spliced")
		rec := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.test" && !r.Allowed })
		assert.Equal(t, ReasonRequestsUnseen, rec.Reason)
	})
	t.Run("no interceptor: TLS in a tunnel refused", func(t *testing.T) {
		w := newWorld(t, requestEntries, nil)
		c, br, resp := w.connectTo(fmt.Sprintf("api.test:%d", w.tlsAddr.Port()))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{ServerName: "api.test", RootCAs: w.ca.Pool})
		assert.Error(t, tc.Handshake(), "TLS in a tunnel to a host whose requests must be judged was spliced")
		rec := w.waitRecord(func(r egresslog.Record) bool {
			return r.Kind == egresslog.KindConnect && r.Reason == ReasonRequestsUnseen
		})
		assert.False(t, rec.Allowed)
	})
	t.Run("other TCP refused", func(t *testing.T) {
		w := newWorld(t, requestEntries, func(p *Proxy) { p.Interceptor = &claimsNothing{} })
		w.setNames("api.test")
		c := w.dial(w.echoAddr)
		c.Write([]byte("SSH-2.0-client\r\n"))
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(c)
		assert.Empty(t, got, "bytes reached the echo service unseen")
		rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && !r.Allowed })
		assert.Equal(t, ReasonRequestsUnseen, rec.Reason)
	})
}

// TestDenyRequestEntryNotCarriedByAnAddress: a name whose requests a deny
// entry judges is not let through by an entry for its address, on plain
// HTTP or TLS: those would carry its requests unseen.
func TestDenyRequestEntryNotCarriedByAnAddress(t *testing.T) {
	w := newWorld(t, []string{"!DELETE api.test:*/**", "127.0.0.2:*"}, nil)
	c := w.dial(w.httpAddr)
	pipeline(t, c, func(p string) string { return p }, fmt.Sprintf("api.test:%d", w.httpAddr.Port()), []exchange{
		{"DELETE", "/repos/acme/prod", http.StatusForbidden, policy.ReasonNoRule},
	})
	_, err := w.httpsGet(w.tlsAddr, "api.test")
	assert.Error(t, err, "TLS for the name was spliced by the address entry")
	// The address entry still allows what names no such entry.
	body, err := w.httpsGet(w.tlsAddr, "other.test")
	require.NoError(t, err)
	assert.NotEmpty(t, body)
}

// TestRecordedPathAsSent: a request's path is recorded as it was sent,
// escapes and all: decoded, an encoded "?" ended the recorded path there,
// though the upstream received the rest.
func TestRecordedPathAsSent(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	c := w.dial(w.httpAddr)
	fmt.Fprintf(c, "GET /ok%%3F/exfil/c2VjcmV0 HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP })
	assert.Equal(t, "/ok%3F/exfil/c2VjcmV0", rec.Path)
}
