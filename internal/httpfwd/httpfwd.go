// Package httpfwd is the HTTP forwarding that tproxy (plain HTTP) and mitm
// (intercepted HTTPS) share: the upstream transports, which dial through
// netguard, one per private-network permission; the description of an
// upstream failure, which never repeats the request's URL; and the host of
// a Host header.
package httpfwd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthold/egress/netguard"
)

// Defaults for a Config's zero fields.
const (
	DefaultDialTimeout           = 10 * time.Second
	DefaultResponseHeaderTimeout = 60 * time.Second
	DefaultMaxIdleConnsPerHost   = 16
	// MaxResponseHeaderBytes bounds a response's head: net/http's own
	// bound is 10 MB, which an upstream could send for every request.
	MaxResponseHeaderBytes = 1 << 20
)

// Config configures the upstream transports.
type Config struct {
	Guard    *netguard.Guard   // nil: netguard's built-in classification
	Resolver netguard.Resolver // nil: net.DefaultResolver
	// DialTimeout bounds a dial and a TLS handshake; zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a response's head once
	// the request is sent; zero means DefaultResponseHeaderTimeout.
	ResponseHeaderTimeout time.Duration
	// RootCAs verify upstream TLS; nil means the system roots.
	RootCAs *x509.CertPool
	// MaxIdleConnsPerHost bounds the kept-alive connections per host;
	// zero means DefaultMaxIdleConnsPerHost.
	MaxIdleConnsPerHost int
	// HTTP2 lets upstream TLS connections speak HTTP/2 when the server
	// offers it.
	HTTP2 bool
	// H2C makes the transports speak HTTP/2 with prior knowledge over
	// plain TCP, and nothing else: for requests that came that way (plain
	// gRPC), whose streams and trailers HTTP/1.1 cannot carry.
	H2C bool
	// MaxConnsPerHost bounds the connections to one host, idle or not;
	// requests beyond wait for one. Zero means no bound.
	MaxConnsPerHost int
	// Check, if set, is asked of every address a dial would use (see
	// netguard.Dialer.Check): policy.DialCheck, for the per-address
	// rules of the policy a request carries.
	Check func(ctx context.Context, host string, addr netip.AddrPort) error
	// Admit, if set, is asked before each dial; an error refuses it, and
	// release is called when the connection closes: a budget of
	// connections across hosts.
	Admit func() (release func(), err error)
}

// Transports are the upstream transports of one proxy: index 1 may dial
// private networks, index 0 may not. Neither ever uses an environment
// proxy, and neither decompresses (bodies pass as the server sent them).
type Transports struct {
	t     [2]*http.Transport
	open  atomic.Int64 // connections dialled and not yet closed
	users atomic.Int64 // requests Pools gave the pair that have not yet returned
}

// NewTransports makes the pair.
func NewTransports(cfg Config) *Transports {
	ts := new(Transports)
	for i, allowPrivate := range []bool{false, true} {
		dial := orDefault(cfg.DialTimeout, DefaultDialTimeout)
		d := &netguard.Dialer{Guard: cfg.Guard, AllowPrivate: allowPrivate, Resolver: cfg.Resolver, Timeout: dial, Check: cfg.Check}
		t := netguard.NewTransport(d)
		t.DialContext = ts.counted(d.DialContext, cfg.Admit)
		t.MaxConnsPerHost = cfg.MaxConnsPerHost
		t.TLSClientConfig = &tls.Config{RootCAs: cfg.RootCAs}
		t.TLSHandshakeTimeout = dial
		t.ResponseHeaderTimeout = orDefault(cfg.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
		t.MaxResponseHeaderBytes = MaxResponseHeaderBytes
		t.ForceAttemptHTTP2 = cfg.HTTP2
		if cfg.H2C {
			t.Protocols = new(http.Protocols)
			t.Protocols.SetUnencryptedHTTP2(true)
		}
		t.MaxIdleConnsPerHost = int(orDefault(time.Duration(cfg.MaxIdleConnsPerHost), DefaultMaxIdleConnsPerHost))
		t.DisableCompression = true // bodies pass as the server sent them
		ts.t[i] = t
	}
	return ts
}

// counted counts the connections dial makes until each closes, asking
// admit, if set, before each dial, and releasing when the connection
// closes.
func (ts *Transports) counted(dial func(ctx context.Context, network, addr string) (net.Conn, error), admit func() (func(), error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		release := func() {}
		if admit != nil {
			var err error
			if release, err = admit(); err != nil {
				return nil, err
			}
		}
		ts.open.Add(1)
		closed := func() { ts.open.Add(-1); release() }
		c, err := dial(ctx, network, addr)
		if err != nil {
			closed()
			return nil, err
		}
		return &releasingConn{Conn: c, release: closed}, nil
	}
}

// Open is how many connections the pair dialled that are not yet closed.
func (ts *Transports) Open() int64 {
	return ts.open.Load()
}

// unused says that the pair holds no connection and no request of Pools'
// is on its way to dial one.
func (ts *Transports) unused() bool {
	return ts.users.Load() == 0 && ts.open.Load() == 0
}

// releasingConn calls release once, when it closes.
type releasingConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *releasingConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// For returns the transport for a policy's private-network permission.
func (ts *Transports) For(allowPrivate bool) *http.Transport {
	if allowPrivate {
		return ts.t[1]
	}
	return ts.t[0]
}

// CloseIdleConnections drops both transports' kept-alive connections.
func (ts *Transports) CloseIdleConnections() {
	for _, t := range ts.t {
		t.CloseIdleConnections()
	}
}

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// Failure is an upstream error as an answer and a record tell it.
type Failure struct {
	// Why describes the error without the request's URL, whose query may
	// carry an injected secret.
	Why string
	// Refused is set when netguard refused the upstream address: a
	// denial, not a network fault.
	Refused bool
	// Certificate is set when the upstream's certificate was rejected.
	Certificate bool
}

// Describe turns an error of a round trip into a Failure.
func Describe(err error) Failure {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is dropped here
	}
	f := Failure{Why: err.Error()}
	var cv *tls.CertificateVerificationError
	var hn x509.HostnameError
	var ua x509.UnknownAuthorityError
	switch {
	case errors.As(err, &cv), errors.As(err, &hn), errors.As(err, &ua):
		f.Certificate = true
		f.Why = "upstream certificate rejected: " + f.Why
	case errors.Is(err, netguard.ErrDenied):
		f.Refused = true
	}
	return f
}

// HostOnly returns the host of a Host header value, without its port or
// an IPv6 literal's brackets. A value that is neither host nor host:port
// ("[::1" say) is returned as it is, to be judged invalid.
func HostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	if len(hostport) > 1 && hostport[0] == '[' && hostport[len(hostport)-1] == ']' {
		return hostport[1 : len(hostport)-1]
	}
	return hostport
}

// IsDoH reports whether a request looks like DNS over HTTPS: a DNS
// message in its body or asked for (RFC 8484's application/dns-message,
// and the older types resolvers still accept), the JSON form some
// resolvers speak (application/dns-json, also asked for with ?ct=), a
// "dns" query parameter (RFC 8484's GET form), a "name" parameter with a
// "type" or to a resolver's path (the JSON GET form, whose type defaults
// to A), or anything sent to a path whose last segment is "dns-query"
// (RFC 8484's conventional endpoint, whatever the media type). Every
// value of every header counts, and ";" separates parameters as "&" does.
// Such a request resolves any name past the gateway's DNS. It is a
// heuristic: a resolver that takes other forms still needs its host kept
// out by the policy.
func IsDoH(r *http.Request) bool {
	for _, key := range []string{"Content-Type", "Accept"} {
		for _, h := range r.Header.Values(key) {
			for part := range strings.SplitSeq(h, ",") {
				if mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part)); dohTypes[mt] {
					return true
				}
			}
		}
	}
	last := path.Base(path.Clean("/" + r.URL.Path))
	if dohPaths[last] == dohQueryPath {
		return true
	}
	q, _ := url.ParseQuery(strings.ReplaceAll(r.URL.RawQuery, ";", "&"))
	return q.Has("dns") || dohTypes[q.Get("ct")] || (q.Has("name") && (q.Has("type") || dohPaths[last] != 0))
}

// dohPaths are the last path segments of resolvers' endpoints: where
// anything is DNS, or where a "name" parameter alone is a question.
var dohPaths = map[string]int{"dns-query": dohQueryPath, "resolve": dohNamePath, "dns-json": dohNamePath}

const (
	dohQueryPath = 1 + iota
	dohNamePath
)

// dohTypes are the media types of DNS messages over HTTP.
var dohTypes = map[string]bool{
	"application/dns-message":       true,
	"application/dns-json":          true,
	"application/dns-udpwireformat": true, // before RFC 8484
	"application/x-dns-message":     true,
}
