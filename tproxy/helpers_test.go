package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// world is a proxy on loopback in front of real servers: an HTTPS server
// and an HTTP server that say which address they are, a server-first
// banner service, and an echo service. Agent "a1" is 127.0.0.1. The
// original destination of the next transparent connection is set with
// redirect, standing in for nftables (the namespace test uses the real
// thing).
type world struct {
	t        *testing.T
	ca       *testkit.CA
	proxy    *Proxy
	log      *egresslog.Log
	pol      atomic.Pointer[policy.Policy]
	names    atomic.Pointer[[]string]
	origDst  atomic.Value // netip.AddrPort
	tproxyLn net.Listener
	explicit net.Listener

	tlsAddr, httpAddr, bannerAddr, echoAddr netip.AddrPort // on 127.0.0.2
	otherTLS                                netip.AddrPort // 127.0.0.3: the "wrong" server
	mismatchEnded                           chan error     // serveLong's /mismatch: how its connection ended
}

func newWorld(t *testing.T, allow []string, configure func(*Proxy)) *world {
	t.Helper()
	w := &world{t: t, ca: testkit.NewCA(t), log: &egresslog.Log{}}
	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: allow})
	empty := []string{}
	w.names.Store(&empty)
	w.tlsAddr = w.serveTLS("127.0.0.2:0", "api.test", "other.test", "blocked.test")
	// The "wrong" server listens on the same port at another address.
	w.otherTLS = w.serveTLS(fmt.Sprintf("127.0.0.3:%d", w.tlsAddr.Port()), "api.test")
	w.httpAddr = w.serveHTTP("127.0.0.2")
	w.bannerAddr = w.serveBanner("127.0.0.2")
	w.echoAddr = w.serveEcho("127.0.0.2")

	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	loop2 := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	w.proxy = &Proxy{
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) {
			if src == netip.MustParseAddr("127.0.0.1") {
				return "a1", w.pol.Load(), true
			}
			return "", nil, false
		},
		Names: func(agent string, _ netip.Addr) []string { return *w.names.Load() },
		Guard: guard,
		Resolver: testkit.Resolver{
			"api.test": loop2, "other.test": loop2, "blocked.test": loop2, "svc.test": loop2,
			"meta.test": {netip.MustParseAddr("169.254.169.254")},
		},
		Log:         w.log,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return w.origDst.Load().(netip.AddrPort), nil },
	}
	if configure != nil {
		configure(w.proxy)
	}
	w.tproxyLn = listenLoop(t, "127.0.0.1:0")
	w.explicit = listenLoop(t, "127.0.0.1:0")
	serveDone := make(chan error, 2)
	go func() { serveDone <- w.proxy.Serve(w.tproxyLn) }()
	go func() { serveDone <- w.proxy.ServeExplicit(w.explicit) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		assert.NoError(t, w.proxy.Shutdown(ctx), "Shutdown")
		for range 2 {
			err := <-serveDone
			assert.Same(t, ErrServerClosed, err, "Serve returned %v, want ErrServerClosed", err)
		}
	})
	return w
}

func (w *world) setPolicy(cfg policy.Config) {
	p, err := policy.New(cfg)
	require.NoError(w.t, err)
	w.pol.Store(p)
}

func (w *world) setNames(names ...string) { w.names.Store(&names) }

func listenLoop(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serveTLS runs an HTTPS server on addr that answers "<addr> <host>".
func (w *world) serveTLS(addr string, names ...string) netip.AddrPort {
	ln := listenLoop(w.t, addr)
	addr = ln.Addr().String()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "%s %s", addr, r.Host)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{w.ca.Issue(w.t, names...)}},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(ln, "", "")
	w.t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(addr)
}

// serveHTTP runs a plain HTTP server that answers "<addr> <host>".
func (w *world) serveHTTP(ip string) netip.AddrPort {
	ln := listenLoop(w.t, ip+":0")
	addr := ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "%s %s", addr, r.Host)
	})}
	go srv.Serve(ln)
	w.t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(addr)
}

// serveBanner runs a server-first service: it greets, then echoes a line.
func (w *world) serveBanner(ip string) netip.AddrPort {
	ln := listenLoop(w.t, ip+":0")
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		fmt.Fprintf(c, "SSH-2.0-test_banner\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil {
			fmt.Fprintf(c, "got %s", line)
		}
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

// serveEcho runs an echo service that answers after the client half-closes.
func (w *world) serveEcho(ip string) netip.AddrPort {
	ln := listenLoop(w.t, ip+":0")
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		b, _ := io.ReadAll(c)
		c.Write(append([]byte("echo:"), b...))
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

func acceptLoop(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go handle(c)
	}
}

// dial connects to the transparent proxy as if to dst.
func (w *world) dial(dst netip.AddrPort) net.Conn {
	w.t.Helper()
	c, err := w.tryDial(dst)
	require.NoError(w.t, err)
	return c
}

// tryDial is dial for connections the proxy may reset at once.
func (w *world) tryDial(dst netip.AddrPort) (net.Conn, error) {
	w.origDst.Store(dst)
	c, err := net.Dial("tcp", w.tproxyLn.Addr().String())
	if err == nil {
		w.t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// httpsGet fetches https://host/ through a transparent connection to dst.
func (w *world) httpsGet(dst netip.AddrPort, sni string) (string, error) {
	c := w.dial(dst)
	defer c.Close()
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: w.ca.Pool})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// waitRecord waits for a record matching f, failing after a bound.
func (w *world) waitRecord(f func(egresslog.Record) bool) egresslog.Record {
	w.t.Helper()
	return testkit.WaitRecord(w.t, w.log, f)
}
