package tproxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/netguard"
)

// ServeExplicit serves the explicit proxy (the HTTPS_PROXY and HTTP_PROXY
// target) on ln: HTTP CONNECT tunnels, and absolute-form plain HTTP
// requests, with the same decisions, dial path and records as the
// transparent proxy. It returns ErrServerClosed after Shutdown or Close.
func (p *Proxy) ServeExplicit(ln net.Listener) error {
	p.init()
	p.httpOnce.Do(p.startHTTP)
	p.startSweeper()
	srv := p.newHTTPServer(http.HandlerFunc(p.serveExplicit), func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, factsKey{}, connFacts{src: addrPortOf(c.RemoteAddr()), explicit: true})
	})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	p.explicitSrvs = append(p.explicitSrvs, srv)
	p.mu.Unlock()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return ErrServerClosed
}

func (p *Proxy) serveExplicit(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		p.serveConnect(w, r)
	case r.URL.IsAbs():
		p.serveHTTP(w, r)
	default:
		http.Error(w, "this is an egress proxy: send CONNECT or an absolute http:// URL", http.StatusBadRequest)
	}
}

// serveConnect judges a CONNECT target, then runs the tunnel as a session:
// what flows inside is judged again like a transparent connection (TLS by
// its server name, HTTP by each Host), with the CONNECT host as the name
// for other TCP.
func (p *Proxy) serveConnect(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	f, _ := r.Context().Value(factsKey{}).(connFacts)
	rec := egresslog.Record{Time: start, Kind: egresslog.KindConnect, Host: r.Host}
	refuse := func(status int, why string) {
		rec.Reason, rec.Status, rec.Duration = why, status, time.Since(start)
		p.record(rec)
		http.Error(w, "egress denied: "+why, status)
	}
	host, portText, err := net.SplitHostPort(r.Host)
	port, perr := strconv.ParseUint(portText, 10, 16)
	if err != nil || perr != nil || port == 0 {
		refuse(http.StatusBadRequest, "CONNECT needs host:port")
		return
	}
	rec.Host, rec.Port = host, uint16(port)
	agent, pol, ok := p.lookupAgent(f.src.Addr())
	if !ok {
		refuse(http.StatusForbidden, ReasonUnknownSource)
		return
	}
	rec.Agent = agent
	dst := netip.AddrPortFrom(netip.Addr{}, uint16(port))
	var names []string
	switch a, err := netguard.ParseLiteral(host); {
	case err == nil:
		dst = netip.AddrPortFrom(a.Unmap(), uint16(port))
	case errors.Is(err, netguard.ErrNotLiteral):
		names = []string{host}
	default:
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	name := ""
	if len(names) > 0 {
		name = names[0]
	}
	if _, d := decide(pol, name, dst); !d.Allowed {
		rec.Rule = d.Rule
		refuse(http.StatusForbidden, d.Reason)
		return
	}
	release, why := p.acquire(agent, pol)
	if why != "" {
		refuse(http.StatusServiceUnavailable, why)
		return
	}
	defer release()
	if !p.beginSession() {
		refuse(http.StatusServiceUnavailable, ReasonShuttingDown)
		return
	}
	defer p.sessionsWG.Done()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		refuse(http.StatusInternalServerError, "cannot take over the connection: "+err.Error())
		return
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		rec.Reason, rec.Duration = "client: "+err.Error(), time.Since(start)
		p.record(rec)
		conn.Close()
		return
	}
	buffered, _ := brw.Reader.Peek(brw.Reader.Buffered())
	ctx, cancel := context.WithCancel(p.baseCtx)
	defer cancel()
	s := &session{p: p, ctx: ctx, client: conn, agent: agent, pol: pol, src: f.src, dst: dst, names: names, kind: egresslog.KindConnect, start: start}
	s.run(buffered)
}
