package tproxy

import (
	"bufio"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// connectTo sends a CONNECT for target (with extra header lines) to the
// explicit proxy, from 127.0.0.1, and reads the answer.
func (w *world) connectTo(target string, header ...string) (net.Conn, *bufio.Reader, *http.Response) {
	w.t.Helper()
	c, err := net.Dial("tcp", w.explicit.Addr().String())
	require.NoError(w.t, err)
	w.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, strings.Join(append(header, ""), "\r\n"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(w.t, err, "CONNECT %s", target)
	return c, br, resp
}

// TestConnectAnswers: a CONNECT is answered only once its target is judged
// and dialled; each refusal and failure has its status, its Proxy-Status
// error type, and a record with the target as asked.
func TestConnectAnswers(t *testing.T) {
	w := newWorld(t, []string{"*"}, func(p *Proxy) {
		r := p.Resolver.(testkit.Resolver)
		r["closed.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
		r["own.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.9")}
		r["db.test"] = []netip.Addr{netip.MustParseAddr("10.20.30.40")}
		p.Guard.SetOwn([]netip.Prefix{netip.MustParsePrefix("127.0.0.9/32")})
	})
	closedPort := freePort(t)
	for _, tc := range []struct {
		name, target string
		status       int
		errType      string
		reason       string // contained in the record's reason
	}{
		{"metadata address", "169.254.169.254:443", 403, "destination_ip_prohibited", "cloud metadata"},
		{"metadata, IPv4-mapped IPv6", "[::ffff:169.254.169.254]:80", 403, "destination_ip_prohibited", "metadata"},
		{"metadata, one decimal number", "2852039166:80", 403, "destination_ip_prohibited", "metadata"},
		{"the gateway's own address", "127.0.0.9:80", 403, "destination_ip_prohibited", "127.0.0.9"},
		{"a name resolving to the gateway", "own.test:80", 403, "destination_ip_prohibited", "127.0.0.9"},
		{"a name resolving to metadata", "meta.test:443", 403, "destination_ip_prohibited", "metadata"},
		{"a name that does not resolve", "nowhere.test:443", 502, "destination_not_found", "nowhere.test"},
		{"a port where nothing listens", fmt.Sprintf("closed.test:%d", closedPort), 502, "connection_refused", "refused"},
		{"no port", "api.test", 400, "http_request_error", "host:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, resp := w.connectTo(tc.target)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Contains(t, resp.Header.Get("Proxy-Status"), "error="+tc.errType)
			rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindConnect && r.Target == tc.target })
			assert.False(t, rec.Allowed)
			assert.Equal(t, tc.status, rec.Status)
			assert.Contains(t, rec.Reason, tc.reason)
		})
	}

	t.Run("the client is not told the address a name resolved to", func(t *testing.T) {
		_, _, resp := w.connectTo("db.test:5432")
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("Proxy-Status"), "error=destination_ip_prohibited")
		assert.Contains(t, resp.Header.Get("Proxy-Status"), "private")
		assert.NotContains(t, resp.Header.Get("Proxy-Status"), "10.20.30.40")
		body, _ := io.ReadAll(resp.Body)
		assert.NotContains(t, string(body), "10.20.30.40")
		rec := w.waitRecord(func(r egresslog.Record) bool { return r.Target == "db.test:5432" })
		assert.Contains(t, rec.Reason, "10.20.30.40", "the record has it all")
	})
	t.Run("a name the policy denies", func(t *testing.T) {
		w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test"}})
		defer w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"*"}})
		_, _, resp := w.connectTo("blocked.test:443")
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		assert.Equal(t, `egress; error=http_request_denied; details="`+policy.ReasonNoRule+`"`, resp.Header.Get("Proxy-Status"))
	})
	t.Run("plain HTTP refusals carry Proxy-Status too", func(t *testing.T) {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		fmt.Fprintf(c, "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		assert.Contains(t, resp.Header.Get("Proxy-Status"), "error=destination_ip_prohibited")
	})
	t.Run("the record holds the target asked and the address dialled", func(t *testing.T) {
		target := fmt.Sprintf("API.test.:%d", w.tlsAddr.Port())
		c, br, resp := w.connectTo(target)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body := tlsGet(t, c, br, "api.test", w)
		assert.Contains(t, body, w.tlsAddr.String())
		c.Close()
		rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindConnect && r.Target == target && !r.Open })
		assert.Equal(t, "api.test", rec.Host)
		assert.Equal(t, w.tlsAddr, rec.Addr)
		assert.True(t, rec.Allowed, "%+v", rec)
	})
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	ln := listenLoop(t, "127.0.0.2:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// tlsGet speaks TLS for sni over an answered tunnel, and fetches /.
func tlsGet(t *testing.T, c net.Conn, br *bufio.Reader, sni string, w *world) string {
	t.Helper()
	tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{ServerName: sni, RootCAs: w.ca.Pool})
	require.NoError(t, tc.Handshake())
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// bufferedConn reads through the reader that read the CONNECT answer.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestTunnelTargetMismatch: inside a tunnel to a name, TLS or HTTP for
// another name is refused, even one the policy allows; inside a tunnel to
// an address, the name inside is judged and dialled by its own resolution.
func TestTunnelTargetMismatch(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "other.test:*", "127.0.0.3:*"}, nil)
	port := w.tlsAddr.Port()

	c, br, resp := w.connectTo(fmt.Sprintf("other.test:%d", port))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{ServerName: "api.test", RootCAs: w.ca.Pool})
	assert.Error(t, tc.Handshake(), "TLS for api.test inside a tunnel to other.test")
	rec := w.waitRecord(func(r egresslog.Record) bool {
		return r.Reason == ReasonTargetMismatch && r.Kind == egresslog.KindConnect
	})
	assert.Equal(t, "api.test", rec.Host)
	assert.Equal(t, fmt.Sprintf("other.test:%d", port), rec.Target)

	c, br, resp = w.connectTo(fmt.Sprintf("other.test:%d", w.httpAddr.Port()))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	inner, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusForbidden, inner.StatusCode, "HTTP for api.test inside a tunnel to other.test")
	assert.Contains(t, inner.Header.Get("Proxy-Status"), "error=http_request_denied")

	// A tunnel to an address the policy allows, carrying TLS for a name it
	// allows: the name decides and is dialled by its own resolution
	// (127.0.0.2), not at the address asked (127.0.0.3, the impostor).
	target := fmt.Sprintf("127.0.0.3:%d", port)
	c, br, resp = w.connectTo(target)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body := tlsGet(t, c, br, "api.test", w)
	assert.True(t, strings.HasPrefix(body, w.tlsAddr.String()), "reached %q; want api.test's own address", body)
	c.Close()
	rec = w.waitRecord(func(r egresslog.Record) bool {
		return r.Target == target && r.Kind == egresslog.KindConnect && r.Host == "api.test"
	})
	assert.Equal(t, w.tlsAddr, rec.Addr)
}

// TestIdentifyByCredentials: with Identify set, each request names its
// agent by its Proxy-Authorization; no token or a wrong one is 407 with a
// challenge, and the request never reaches a decision.
func TestIdentifyByCredentials(t *testing.T) {
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}})
	require.NoError(t, err)
	w := newWorld(t, nil, func(p *Proxy) {
		p.Identify = func(c Credentials) (string, *policy.Policy, error) {
			switch {
			case c.Token == "":
				return "", nil, errors.New("a token is required")
			case c.User == "remote" && subtle.ConstantTimeCompare([]byte(c.Token), []byte("s3cret")) == 1:
				return "remote", pol, nil
			}
			return "", nil, errors.New("unknown agent or wrong token")
		}
	})
	basic := func(user, token string) string {
		return "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+token))
	}
	target := fmt.Sprintf("api.test:%d", w.tlsAddr.Port())
	for _, tc := range []struct {
		name   string
		header []string
		status int
	}{
		{"no token", nil, http.StatusProxyAuthRequired},
		{"wrong token", []string{basic("remote", "guess")}, http.StatusProxyAuthRequired},
		{"unknown agent", []string{basic("other", "s3cret")}, http.StatusProxyAuthRequired},
		{"malformed", []string{"Proxy-Authorization: Basic !!!"}, http.StatusProxyAuthRequired},
		{"right token", []string{basic("remote", "s3cret")}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, resp := w.connectTo(target, tc.header...)
			c.Close()
			assert.Equal(t, tc.status, resp.StatusCode)
			if tc.status == http.StatusProxyAuthRequired {
				assert.Equal(t, `Basic realm="egress"`, resp.Header.Get("Proxy-Authenticate"))
			}
		})
	}
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Agent == "remote" && r.Kind == egresslog.KindConnect })
	assert.True(t, rec.Allowed)

	// Plain HTTP is identified per request too; a 407 closes the
	// connection.
	for _, tc := range []struct {
		header string
		status int
	}{{"", http.StatusProxyAuthRequired}, {basic("remote", "s3cret") + "\r\n", http.StatusOK}} {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET http://api.test:%d/ HTTP/1.1\r\nHost: api.test\r\n%s\r\n", w.httpAddr.Port(), tc.header)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode)
	}
}

func TestProxyAuthorization(t *testing.T) {
	for _, tc := range []struct {
		in          string
		user, token string
		ok          bool
	}{
		{"", "", "", true},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("alice:tok:en")), "alice", "tok:en", true},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("alice:t")), "alice", "t", true},
		{"Bearer abc", "", "abc", true},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("alice")), "", "", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("alice:")), "", "", false},
		{"Basic %%%", "", "", false},
		{"Bearer ", "", "", false},
		{"Digest x", "", "", false},
	} {
		user, token, ok := proxyAuthorization(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		if tc.ok {
			assert.Equal(t, tc.user, user, "%q", tc.in)
			assert.Equal(t, tc.token, token, "%q", tc.in)
		}
	}
}

// TestIdentifyByClientCertificate: an explicit proxy that listens with TLS
// hands the client's certificate to Identify, and tunnels through the TLS
// connection like any other.
func TestIdentifyByClientCertificate(t *testing.T) {
	ca := testkit.NewCA(t)
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}})
	require.NoError(t, err)
	w := newWorld(t, nil, func(p *Proxy) {
		p.Identify = func(c Credentials) (string, *policy.Policy, error) {
			if len(c.PeerCertificates) == 0 {
				return "", nil, errors.New("a client certificate is required")
			}
			leaf := c.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				return "", nil, err
			}
			return leaf.Subject.CommonName, pol, nil
		}
	})
	ln := listenLoop(t, "127.0.0.1:0")
	serverCert := ca.Issue(t, "127.0.0.1")
	go w.proxy.ServeExplicit(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.RequireAnyClientCert}))
	dial := func(cert []tls.Certificate) (net.Conn, *bufio.Reader, *http.Response) {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool, Certificates: cert})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "CONNECT api.test:%d HTTP/1.1\r\nHost: api.test\r\n\r\n", w.tlsAddr.Port())
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		return c, br, resp
	}
	c, br, resp := dial([]tls.Certificate{ca.Issue(t, "remote-7")})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, tlsGet(t, c, br, "api.test", w), w.tlsAddr.String())
	c.Close()
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindConnect && r.Allowed })
	assert.Equal(t, "remote-7", rec.Agent)

	other := testkit.NewCA(t) // a certificate of another authority
	_, _, resp = dial([]tls.Certificate{other.Issue(t, "remote-7")})
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
}

// TestDoHOverPlainHTTPRefused: a DNS-over-HTTPS request in plain HTTP is
// refused unless the policy names its host exactly.
func TestDoHOverPlainHTTPRefused(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open})
	c, err := net.Dial("tcp", w.explicit.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	for _, q := range []string{"/dns-query?dns=AAABAAABAAAAAAAAA3d3dwdleGFtcGxlA2NvbQAAAQAB", "/plain"} {
		fmt.Fprintf(c, "GET http://api.test:%d%s HTTP/1.1\r\nHost: api.test\r\n\r\n", w.httpAddr.Port(), q)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if strings.Contains(q, "dns=") {
			assert.Equal(t, http.StatusForbidden, resp.StatusCode)
			assert.Contains(t, resp.Header.Get("Proxy-Status"), policy.ReasonDoH)
		} else {
			assert.Equal(t, http.StatusOK, resp.StatusCode)
		}
	}
}

// TestForget: an agent's open tunnels and transparent connections end
// when the agent is forgotten; another agent's do not.
func TestForget(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	c, br, resp := w.connectTo(fmt.Sprintf("api.test:%d", w.echoAddr.Port()))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	w.setNames("api.test")
	tc := w.dial(w.echoAddr)
	tc.Write([]byte("x\n")) // other TCP, judged by the remembered name
	require.Eventually(t, func() bool {
		v, ok := w.proxy.agentConns.Load("a1")
		return ok && len(v.(*connSet).snapshot()) == 2
	}, 5*time.Second, 10*time.Millisecond, "the tunnel and the transparent connection are not both held")
	w.proxy.Forget("nobody")
	w.proxy.Forget("a1")
	for name, conn := range map[string]io.Reader{"the tunnel": br, "the transparent connection": tc} {
		done := make(chan error, 1)
		go func() { _, err := io.ReadAll(conn); done <- err }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			assert.Fail(t, name+" outlived its agent")
		}
	}
	c.Close()
}
