package tproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/internal/httpmeter"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// connFacts are what the proxy knows of a connection whose HTTP requests
// net/http serves: who sent it and where it was going.
type connFacts struct {
	src      netip.AddrPort
	dst      netip.AddrPort // the original destination (transparent, CONNECT)
	explicit bool           // a connection to the explicit proxy port itself
	// For a connection a session handed over: its agent, and, inside a
	// CONNECT tunnel, the target as asked and the name every Host must be
	// when the target was a name.
	agent         string
	current       policy.Current
	connectTarget string
	tunnelName    string
	// tunnelApproval is the approval that opened the tunnel (ask mode),
	// which covers the requests inside it: they are for its name.
	tunnelApproval policy.Decision
}

type factsKey struct{}

// httpConn is a transparent connection handed to the HTTP server.
type httpConn struct {
	*prefixConn
	facts connFacts
}

// handoffHTTP gives a connection that speaks HTTP/1 to the shared HTTP
// server, which judges each request on its own Host, and waits until the
// server is done with it.
func (p *Proxy) handoffHTTP(s *session, prefix []byte) {
	p.httpOnce.Do(p.startHTTP)
	pc := s.paced(newPrefixConn(s.client, prefix))
	facts := connFacts{src: s.src, dst: s.dst, agent: s.agent, current: s.current, connectTarget: s.connectTarget, tunnelName: s.connectName}
	if s.predial != nil && s.predial.target.decision.Approved {
		facts.tunnelApproval = s.predial.target.decision
	}
	if !p.httpConns.push(&httpConn{prefixConn: pc, facts: facts}) {
		reset(s.client)
		return
	}
	select {
	case <-pc.closed:
	case <-s.ctx.Done(): // a forced shutdown: hijacked upgrades are not the server's to close
		pc.Close()
	}
}

func (p *Proxy) startHTTP() {
	cfg := httpfwd.Config{
		Guard: p.Guard, Resolver: p.Resolver, DialTimeout: orDefault(p.DialTimeout, DefaultDialTimeout), Check: policy.DialCheck,
	}
	p.pools.New = func(string) *httpfwd.Transports { return httpfwd.NewTransports(cfg) }
	h2c := cfg
	h2c.H2C = true
	p.poolsH2C.New = func(string) *httpfwd.Transports { return httpfwd.NewTransports(h2c) }
	p.forward = &httputil.ReverseProxy{
		Rewrite:   rewritePlain,
		Transport: plainTransport{p},
		// Zero: streams (server-sent events, unknown length) are flushed on
		// every write; fixed-length bodies are buffered.
		FlushInterval: 0,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler:  plainError,
	}
	p.httpConns = newConnQueue()
	p.httpSrv = p.newHTTPServer(http.HandlerFunc(p.serveHTTP), func(ctx context.Context, c net.Conn) context.Context {
		if hc, ok := c.(*httpConn); ok {
			return context.WithValue(ctx, factsKey{}, hc.facts)
		}
		return ctx
	})
	// Transparent HTTP may be HTTP/2 with prior knowledge (h2c: plain
	// gRPC): each stream is a request, judged by its own :authority.
	p.httpSrv.Protocols = new(http.Protocols)
	p.httpSrv.Protocols.SetHTTP1(true)
	p.httpSrv.Protocols.SetUnencryptedHTTP2(true)
	go p.httpSrv.Serve(p.httpConns)
}

func (p *Proxy) newHTTPServer(h http.Handler, connContext func(context.Context, net.Conn) context.Context) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: orDefault(p.HelloTimeout, DefaultHelloTimeout),
		IdleTimeout:       min(orDefault(p.IdleTimeout, DefaultIdleTimeout), 2*time.Minute),
		MaxHeaderBytes:    64 << 10,
		ConnContext:       connContext,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
}

// serveHTTP proxies one plain HTTP request, transparent or absolute-form,
// judged on its own Host.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	client, w := httpfwd.NewClient(w, r)
	defer client.Finish()
	f, _ := r.Context().Value(factsKey{}).(connFacts)
	rec := egresslog.Record{Time: start, Kind: egresslog.KindHTTP, Method: r.Method, Path: r.URL.EscapedPath(), Target: f.connectTarget,
		Trace: r.Header.Get("Traceparent")}
	refuse := func(a answer) {
		client.Answering()
		rec.Allowed, rec.Reason, rec.Status, rec.Duration = false, a.why, a.status, time.Since(start)
		if !a.unrecorded {
			p.record(rec)
		}
		a.write(w)
	}
	// The agent's policy now: a request on a kept-alive connection is
	// judged by the policy of its moment, not the connection's.
	agent, pol, current := f.agent, (*policy.Policy)(nil), f.current
	if f.explicit {
		who, refusal := p.identify(r, f.src.Addr())
		if refusal != nil {
			refuse(*refusal)
			return
		}
		agent, pol, current = who.agent, who.pol, who.current
	} else if f.current != nil {
		pol = f.current()
	}
	if pol == nil {
		refuse(denied(http.StatusForbidden, ReasonUnknownSource))
		return
	}
	rec.Agent = agent
	// Forget and Rejudge find the request from now on: while it waits
	// for an approval, while it is forwarded, and after, as an upgrade's
	// tunnel.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	r = r.WithContext(ctx)
	// Forgotten while it is judged, it ends at once, though its client
	// holds it (the body an MCP endpoint's messages are read from).
	tracked, untrack := p.trackAgentConn(agent, nil, func() { cancel(); client.Stop() })
	defer untrack()
	var paceUp, paceDown *pacer
	if f.explicit {
		// An explicit-proxy request (an upgrade too, which the handler
		// holds) counts as a connection of its own: the connection it
		// came on was never counted.
		release, why := p.acquire(agent, pol)
		if why != "" {
			refuse(budgetAnswer(why))
			return
		}
		defer release()
		// Its bytes are held to the agent's quotas here; a transparent
		// connection's are on the connection itself.
		q := pol.Quotas()
		paceUp, paceDown = p.pacer(&p.bytesUp, agent, q.BytesPerSecondUp), p.pacer(&p.bytesDown, agent, q.BytesPerSecondDown)
		if paceUp != nil {
			paceUp.moved(httpmeter.HeadSize(r)) // read before its agent was known
			r.Body = &pacedBody{ReadCloser: r.Body, pace: paceUp}
		}
		if paceDown != nil {
			w = &pacedWriter{ResponseWriter: w, pace: paceDown}
		}
	}
	host, dst, err := httpTarget(r, f)
	if err != nil {
		refuse(answer{status: http.StatusBadRequest, errType: "http_request_error", why: err.Error(), refused: true})
		return
	}
	rec.Host, rec.Port = host, dst.Port()
	if f.tunnelName != "" {
		if name, err := hostname.Normalize(host); err != nil || name != f.tunnelName {
			refuse(denied(http.StatusForbidden, ReasonTargetMismatch))
			return
		}
	}
	t, d := decide(pol, host, dst)
	if f.tunnelApproval.Approved && d.Askable {
		// Inside a tunnel approved for this very name (the Host was
		// checked against it), and still the approver's to decide.
		t, d = target{host: d.Name, port: dst.Port(), decision: f.tunnelApproval}, f.tunnelApproval
	}
	t, d = p.askFor(r.Context(), agent, current, t, d, dst.Port(), egresslog.KindHTTP)
	if d.Allowed && t.host != "" && !d.Approved { // an approval allows a name no entry names, nor judges
		// The request itself, by its method and path (and an MCP
		// endpoint's messages), on a host that request entries name
		// (allowed by its address, it has none).
		d = pol.DecideHTTP(r, t.host, dst.Port())
	}
	if tracked.gone() { // while it waited for an approval, or its body was read
		refuse(denied(http.StatusForbidden, ReasonForgotten))
		return
	}
	rec.Allowed, rec.Report, rec.Reason, rec.Rule, rec.Tool = d.Allowed, d.Report, d.Reason, d.Rule, d.Tool
	if !d.Allowed {
		refuse(refusedBy(d))
		return
	}
	if httpfwd.IsDoH(r) {
		if doh := pol.DecideDoH(host, dst.Port()); !doh.Allowed {
			rec.Rule = ""
			refuse(denied(http.StatusForbidden, doh.Reason))
			return
		}
	}
	ended := &ending{stop: func() { cancel(); client.Stop() }}
	done, refused := tracked.moving(ended.end, func() string { return rejudgeRequest(current(), t, d) })
	defer done()
	if refused { // by a policy or a Forget that came while it was judged
		why, _ := ended.reason()
		rec.Rule = ""
		refuse(denied(http.StatusForbidden, why))
		return
	}
	fw := newForwarding(ended.end)
	p.relays.add(fw)
	defer p.relays.remove(fw)
	cw := &httpmeter.Writer{ResponseWriter: fw.watch(w, r)}
	body := httpmeter.CountRequest(r)
	st := &plainState{p: p, agent: agent, pol: pol, target: t, rec: &rec, paceUp: paceUp, paceDown: paceDown, forwarding: fw}
	notes := new(egresslog.Notes)
	// Recorded however the forwarding ends: a response cut short
	// mid-stream ends it with a panic (http.ErrAbortHandler), which the
	// server recovers from.
	defer func() {
		if why, ok := ended.reason(); ok {
			rec.Reason = why
		}
		rec.Reason = notes.Annotate(rec.Reason)
		if cw.Status != 0 { // else an upgrade's, written beneath it
			rec.Status = cw.Status
		}
		rec.BytesUp, rec.BytesDown = body.Bytes(), cw.Bytes
		if u := st.upgraded; u != nil {
			p.endUpgrade(u)
			rec.BytesUp, rec.BytesDown = rec.BytesUp+u.up.Load(), rec.BytesDown+u.down.Load()
		}
		rec.Duration = time.Since(start)
		p.record(rec)
	}()
	p.forward.ServeHTTP(cw, r.WithContext(egresslog.WithNotes(context.WithValue(r.Context(), plainStateKey{}, st), notes)))
}

// plainState is one plain HTTP request's forwarding, for the shared
// ReverseProxy's hooks.
type plainState struct {
	p      *Proxy
	agent  string
	pol    *policy.Policy
	target target
	rec    *egresslog.Record
	// The agent's quotas, when the request holds them (the explicit
	// proxy's), and its activity.
	paceUp, paceDown *pacer
	forwarding       *forwarding
	// upgraded is its tunnel, once its upstream switched protocols.
	upgraded *upgraded
}

type plainStateKey struct{}

func plainStateOf(r *http.Request) *plainState {
	st, _ := r.Context().Value(plainStateKey{}).(*plainState)
	return st
}

// rewritePlain points a plain HTTP request at its judged target, under
// its agent's policy (for the dial's per-address rules).
func rewritePlain(pr *httputil.ProxyRequest) {
	st := plainStateOf(pr.In)
	pr.Out = pr.Out.WithContext(policy.WithPolicy(policy.WithAgent(pr.Out.Context(), st.agent), st.pol))
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = st.target.dialAddress()
	pr.Out.Host = pr.In.Host
}

// plainTransport sends a plain request on its agent's own pool of
// upstream connections, for the policy it was judged by (httpfwd.Pools),
// on the transport for that policy's private-network permission, as
// HTTP/2 with prior knowledge when it came so. An upstream's switch of
// protocols goes through upgraded.
type plainTransport struct{ p *Proxy }

func (t plainTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	st := plainStateOf(r)
	pools := &t.p.pools
	if r.ProtoMajor == 2 {
		pools = &t.p.poolsH2C
	}
	res, err := pools.RoundTrip(st.agent, st.pol, st.pol.AllowPrivateNetworks(), r)
	if err == nil && res.StatusCode == http.StatusSwitchingProtocols {
		if err = t.p.beginUpgrade(st, res); err != nil {
			return nil, err
		}
	}
	return res, err
}

// plainError answers an upstream failure, with its reason, and records
// a refused address (a netguard or policy refusal at dial time) as a
// denial.
func plainError(w http.ResponseWriter, r *http.Request, err error) {
	st := plainStateOf(r)
	f := httpfwd.Describe(err)
	a := dialAnswer(err)
	a.why = reasonUpstreamPrefix + f.Why // without the URL
	st.rec.Reason = a.why
	st.rec.Allowed = !f.Refused
	var resolved *policy.ResolvedError
	if errors.As(err, &resolved) {
		st.rec.Rule = resolved.Rule
	}
	a.write(w)
}

// pacedBody holds a request body to its agent's rate up.
type pacedBody struct {
	io.ReadCloser
	pace *pacer
}

func (b *pacedBody) Read(p []byte) (int, error) { return b.pace.read(b.ReadCloser, p) }

// pacedWriter holds a response, head and body, to its agent's rate
// down. Unwrap lets http.ResponseController reach the writer beneath (to
// flush).
type pacedWriter struct {
	http.ResponseWriter
	pace *pacer
}

func (w *pacedWriter) WriteHeader(code int) {
	w.pace.moved(httpmeter.ResponseHeadSize(code, w.Header()))
	w.ResponseWriter.WriteHeader(code)
}

func (w *pacedWriter) Write(b []byte) (int, error) { return w.pace.write(w.ResponseWriter, b) }

func (w *pacedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// httpTarget returns what a plain HTTP request is judged on: for the
// explicit proxy, its absolute http:// URL's host and port; for a
// transparent connection, its Host header and the connection's original
// destination.
func httpTarget(r *http.Request, f connFacts) (string, netip.AddrPort, error) {
	if !f.explicit {
		return httpfwd.HostOnly(r.Host), f.dst, nil
	}
	if r.URL.Scheme != "http" || r.URL.Host == "" {
		return "", netip.AddrPort{}, errors.New("the explicit proxy takes CONNECT or absolute http:// URLs")
	}
	port, err := urlPort(r.URL.Port())
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	host := r.URL.Hostname()
	dst := netip.AddrPortFrom(netip.Addr{}, port)
	if a, err := netguard.ParseLiteral(host); err == nil {
		dst = netip.AddrPortFrom(a.Unmap(), port)
	}
	return host, dst, nil
}

func urlPort(s string) (uint16, error) {
	if s == "" {
		return 80, nil
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("invalid port %q", s)
	}
	return uint16(n), nil
}

// connQueue is a net.Listener fed by the proxy: Accept returns the
// connections pushed to it.
type connQueue struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) push(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) close() { q.once.Do(func() { close(q.done) }) }

func (q *connQueue) Close() error   { q.close(); return nil }
func (q *connQueue) Addr() net.Addr { return &net.TCPAddr{} }
