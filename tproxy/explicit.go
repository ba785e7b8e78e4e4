package tproxy

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/budget"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// Reasons the explicit proxy gives.
const (
	ReasonBadCredentials = "malformed Proxy-Authorization"
	ReasonTargetMismatch = "the name inside the tunnel is not the CONNECT target"
)

// Credentials are what a request to the explicit proxy says of who sent
// it, for Proxy.Identify.
type Credentials struct {
	Src   netip.Addr     // the connection's source address
	Local netip.AddrPort // the address it came to: which listener
	// User and Token come from Proxy-Authorization: "Basic" user:token,
	// or "Bearer" token (User empty). Both are empty without the header.
	User, Token string
	// PeerCertificates is the client's certificate chain, when the
	// explicit proxy listens with TLS and the client presented one.
	PeerCertificates []*x509.Certificate
}

// ServeExplicit serves the explicit proxy (the HTTPS_PROXY and HTTP_PROXY
// target) on ln: HTTP CONNECT tunnels, and absolute-form plain HTTP
// requests, with the same decisions, dial path and records as the
// transparent proxy. ln may be a TLS listener (crypto/tls.NewListener):
// the client's certificate then reaches Identify. It returns
// ErrServerClosed after Shutdown or Close.
//
// A request beyond the agent's quotas or the proxy's bounds is answered
// 503 with Proxy-Status connection_limit_reached and recorded: with
// default settings, beyond policy.DefaultConnectionsPerSecond (500) new
// connections a second per agent, after a burst of twice as many (so a
// load test from one source sees 503s past roughly 750 a second in its
// first second), beyond MaxConnsPerAgent (2,000) open, or beyond
// MaxExplicitConnsPerSource (1,024) connections from one address. A load
// test sets its policy's quota to -1 and raises those bounds.
//
// A CONNECT that opens a connection is read and answered by the proxy
// itself (serveConnectFirst): its tunnel never pays for an HTTP server's
// machinery. Any other connection (another first request, a TLS
// listener's) is served by net/http, a CONNECT among its requests by the
// same serveConnect.
func (p *Proxy) ServeExplicit(ln net.Listener) error {
	p.init()
	p.httpOnce.Do(p.startHTTP)
	p.startSweeper()
	srv := p.newHTTPServer(http.HandlerFunc(p.serveExplicit), func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, factsKey{}, connFacts{src: addrPortOf(c.RemoteAddr()), explicit: true})
	})
	srv.ConnState = p.boundExplicitConns
	handed := newConnQueue()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	p.explicitSrvs = append(p.explicitSrvs, srv)
	p.listeners[ln] = struct{}{} // Shutdown closes it
	p.mu.Unlock()
	defer p.untrack(ln)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(handed) }()
	err := p.acceptExplicit(ln, handed)
	handed.close()
	<-served
	if err != nil && !p.isClosed() {
		return err
	}
	return ErrServerClosed
}

// acceptExplicit accepts the explicit proxy's connections until ln
// fails: each is bounded by its source (acquireExplicit), then read for
// a first CONNECT, or handed to net/http.
func (p *Proxy) acceptExplicit(ln net.Listener, handed *connQueue) error {
	return p.acceptEach(ln, func(c net.Conn) bool {
		if _, plain := c.(*net.TCPConn); !plain {
			if !handed.push(c) { // net/http bounds it, and shakes a TLS client's hands
				c.Close()
			}
		} else if p.acquireExplicit(c) {
			go p.serveConnectFirst(c, handed)
		}
		return true
	})
}

// boundExplicitConns bounds the connections net/http serves
// (acquireExplicit), and ends a connection's count when it closes or is
// hijacked.
func (p *Proxy) boundExplicitConns(c net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		if _, counted := p.explicitCounted.Load(c); !counted { // else counted when accepted
			p.acquireExplicit(c)
		}
	case http.StateActive:
		if hc, ok := c.(*handedConn); ok {
			hc.unclamp()
		}
	case http.StateHijacked, http.StateClosed:
		p.releaseExplicit(c)
	}
}

// acquireExplicit bounds the connections to each explicit-proxy listener
// that each source address holds open (idle, or with a request head
// coming): a connection beyond MaxExplicitConnsPerSource, or beyond
// MaxConns on that listener, is closed at once. Each listener has its own
// bounds, so that strangers filling one (a listener for remote agents)
// leave the others alone. A tunnel is counted from its 200 on as one of
// its agent's connections instead (releaseExplicit).
func (p *Proxy) acquireExplicit(c net.Conn) bool {
	src := addrPortOf(c.RemoteAddr()).Addr().String()
	listener := addrPortOf(c.LocalAddr())
	v, ok := p.explicitConns.Load(listener)
	if !ok {
		v, _ = p.explicitConns.LoadOrStore(listener, new(budget.Counter))
	}
	open := v.(*budget.Counter)
	if !open.Acquire(src, orDefault(p.MaxExplicitConnsPerSource, DefaultMaxExplicitConnsPerSource), orDefault(p.MaxConns, DefaultMaxConns)) {
		p.logger().Debug("explicit proxy: too many connections from one source", "src", src)
		reset(c)
		return false
	}
	p.explicitCounted.Store(c, open)
	return true
}

// releaseExplicit ends c's count, once.
func (p *Proxy) releaseExplicit(c net.Conn) {
	if counted, ok := p.explicitCounted.LoadAndDelete(c); ok {
		counted.(*budget.Counter).Release(addrPortOf(c.RemoteAddr()).Addr().String())
	}
}

// moveCount moves c's count to next, the connection that stands for it
// from now on.
func (p *Proxy) moveCount(c, next net.Conn) {
	if counted, ok := p.explicitCounted.LoadAndDelete(c); ok {
		p.explicitCounted.Store(next, counted)
	}
}

func (p *Proxy) serveExplicit(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		p.serveConnect(httpReply{w}, r)
	case r.URL.IsAbs():
		p.serveHTTP(w, r)
	default:
		answer{status: http.StatusBadRequest, errType: "http_request_error", refused: true,
			why: "this is an egress proxy: send CONNECT or an absolute http:// URL"}.write(w)
	}
}

// identified is who an explicit-proxy request is from: the agent, its
// policy now, and how to find its policy later (for a tunnel's requests).
type identified struct {
	agent   string
	pol     *policy.Policy
	current policy.Current
}

// identify names the agent behind an explicit-proxy request: by Identify,
// from its credentials, or else by its source address. A source refused
// more than a few times a second has only those refusals recorded.
func (p *Proxy) identify(r *http.Request, src netip.Addr) (identified, *answer) {
	who, refusal := p.identifyRequest(r, src)
	if refusal != nil {
		refusal.unrecorded = !p.unidentified.Take(src.String(), 1, unidentifiedRecordsPerSecond, 2*unidentifiedRecordsPerSecond, time.Now())
	}
	return who, refusal
}

// unidentifiedRecordsPerSecond bounds the records of requests no agent
// was found for, per source.
const unidentifiedRecordsPerSecond = 10

func (p *Proxy) identifyRequest(r *http.Request, src netip.Addr) (identified, *answer) {
	if p.Identify == nil {
		agent, pol, ok := p.lookupAgent(src)
		if !ok {
			return identified{}, &answer{status: http.StatusForbidden, errType: "http_request_denied", why: ReasonUnknownSource, refused: true}
		}
		return identified{agent, pol, p.currentFor(agent, src)}, nil
	}
	creds := Credentials{Src: src}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		creds.Local = addrPortOf(a)
	}
	if r.TLS != nil {
		creds.PeerCertificates = r.TLS.PeerCertificates
	}
	var ok bool
	if creds.User, creds.Token, ok = proxyAuthorization(r.Header.Get("Proxy-Authorization")); !ok {
		return identified{}, &answer{status: http.StatusProxyAuthRequired, errType: "http_request_denied", why: ReasonBadCredentials, refused: true, challenge: true}
	}
	agent, pol, err := p.Identify(creds)
	if err != nil {
		return identified{}, &answer{status: http.StatusProxyAuthRequired, errType: "http_request_denied", why: err.Error(), refused: true, challenge: true}
	}
	// Later, the same credentials: a revoked token or a changed policy
	// applies to the next request in a tunnel opened before.
	current := func() *policy.Policy {
		a, pol, err := p.Identify(creds)
		if err != nil || a != agent {
			return nil
		}
		return pol
	}
	return identified{agent, pol, current}, nil
}

// proxyAuthorization parses a Proxy-Authorization value: Basic user:token
// or Bearer token. An empty value is no credentials; anything else that
// does not parse is not ok.
func proxyAuthorization(v string) (user, token string, ok bool) {
	if v == "" {
		return "", "", true
	}
	scheme, rest, _ := strings.Cut(v, " ")
	rest = strings.TrimSpace(rest)
	switch {
	case strings.EqualFold(scheme, "Basic"): // not a name: an auth scheme
		raw, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return "", "", false
		}
		user, token, ok = strings.Cut(string(raw), ":")
		return user, token, ok && token != ""
	case strings.EqualFold(scheme, "Bearer"): // not a name: an auth scheme
		return "", rest, rest != ""
	}
	return "", "", false
}

// serveConnect answers a CONNECT only once it knows the answer: it judges
// the target, checks it against the guard, and dials it, and says 200 with
// the upstream connection in hand, or why not (403, 502, 504, with a
// Proxy-Status field). The tunnel then runs as a session: inside a tunnel
// to a name, a TLS server name or HTTP Host must be that name; inside a
// tunnel to an address, they are judged as on a transparent connection.
func (p *Proxy) serveConnect(w connectReply, r *http.Request) {
	start := time.Now()
	f, _ := r.Context().Value(factsKey{}).(connFacts)
	rec := egresslog.Record{Time: start, Kind: egresslog.KindConnect, Host: r.Host, Target: r.Host}
	notes := new(egresslog.Notes)
	refuse := func(a answer) {
		rec.Reason, rec.Status, rec.Duration = notes.Annotate(a.why), a.status, time.Since(start)
		rec.Allowed = false
		if !a.unrecorded {
			p.record(rec)
		}
		w.refuse(a)
	}
	host, portText, err := net.SplitHostPort(r.Host)
	port, perr := strconv.ParseUint(portText, 10, 16)
	if err != nil || perr != nil || port == 0 {
		refuse(answer{status: http.StatusBadRequest, errType: "http_request_error", why: "CONNECT needs host:port", refused: true})
		return
	}
	rec.Host, rec.Port = host, uint16(port)
	who, refusal := p.identify(r, f.src.Addr())
	if refusal != nil {
		refuse(*refusal)
		return
	}
	agent, pol := who.agent, who.pol
	rec.Agent = agent
	// Forget finds the request from now on: while it waits for an
	// approval or its dial, as later in its tunnel.
	reqCtx, cancelReq := context.WithCancel(r.Context())
	defer cancelReq()
	tracked, untrack := p.trackAgentConn(agent, nil, cancelReq)
	defer untrack()
	forgotten := tracked.gone

	s := &session{p: p, client: nil, agent: agent, pol: pol, current: who.current, notes: notes, src: f.src, kind: egresslog.KindConnect, start: start, connectTarget: r.Host}
	dialCtx := egresslog.WithNotes(policy.WithAgent(reqCtx, agent), notes)
	var t target
	var d policy.Decision
	switch a, err := netguard.ParseLiteral(host); {
	case err == nil:
		// An address: judged as a transparent connection to it is (by
		// the names the agent resolved to it, then by the address), and
		// dialled before the answer, or refused: a tunnel is answered
		// 200 only with its upstream connection in hand.
		s.dst = netip.AddrPortFrom(a.Unmap(), uint16(port))
		if err := p.Guard.Check(s.dst.Addr(), pol.AllowPrivateNetworks()); err != nil {
			refuse(dialAnswer(err))
			return
		}
		if p.Names != nil {
			s.names = p.Names(agent, s.dst.Addr())
		}
		t, d = s.judgeRaw()
		rec.Rule = d.Rule
		if !d.Allowed {
			refuse(refusedBy(d))
			return
		}
		if t.host != "" {
			rec.Host = t.host
		}
	case errors.Is(err, netguard.ErrNotLiteral):
		s.dst = netip.AddrPortFrom(netip.Addr{}, uint16(port))
		t, d = decideName(pol, host, uint16(port))
		if p.Approver != nil && d.Askable {
			stop := w.whileWaiting()
			t, d = p.askFor(reqCtx, agent, who.current, t, d, uint16(port), egresslog.KindConnect)
			stop()
			if forgotten() {
				refuse(denied(http.StatusForbidden, ReasonForgotten))
				return
			}
		}
		rec.Rule = d.Rule
		if !d.Allowed {
			refuse(refusedBy(d))
			return
		}
		rec.Host = t.host
		s.connectName = t.host
		s.names = []string{t.host}
	default:
		refuse(answer{status: http.StatusBadRequest, errType: "http_request_error", why: err.Error(), refused: true})
		return
	}
	release, why := p.acquire(agent, pol)
	if why != "" {
		refuse(budgetAnswer(why))
		return
	}
	defer release()

	var up *net.TCPConn
	intercepted := s.connectName != "" && p.intercepts(agent, t)
	if intercepted {
		// The Interceptor dials on its own; the name must resolve to an
		// address the guard and the policy permit.
		err = p.checkName(dialCtx, pol, s.connectName, uint16(port))
	} else {
		up, err = p.dial(dialCtx, pol, t)
	}
	if forgotten() {
		if up != nil {
			up.Close()
		}
		refuse(denied(http.StatusForbidden, ReasonForgotten))
		return
	}
	if err != nil {
		refuse(dialAnswer(err))
		return
	}
	if !p.beginSession() {
		if up != nil {
			up.Close()
		}
		refuse(budgetAnswer(ReasonShuttingDown))
		return
	}
	defer p.sessionsWG.Done()
	conn, br, err := w.hijack()
	if err != nil {
		if up != nil {
			up.Close()
		}
		refuse(answer{status: http.StatusInternalServerError, errType: "proxy_internal_error", why: "cannot take over the connection: " + err.Error()})
		return
	}
	ctx, cancel := context.WithCancel(egresslog.WithNotes(policy.WithAgent(p.baseCtx, agent), notes))
	defer cancel()
	if !tracked.answered(conn, cancel) {
		if up != nil {
			up.Close()
		}
		rec.Reason, rec.Duration = ReasonForgotten, time.Since(start)
		p.record(rec)
		return
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		if up != nil {
			up.Close()
		}
		rec.Reason, rec.Duration = "client: "+err.Error(), time.Since(start)
		p.record(rec)
		conn.Close()
		return
	}
	buffered, _ := br.Peek(br.Buffered())
	s.ctx, s.client, s.tracked = ctx, conn, tracked
	// Dialled already, or, when intercepted, dialled only for other TCP.
	s.predial = &predial{target: t, conn: up}
	s.runAndRelay(buffered)
}

// checkName resolves name as a dial would, and fails as the dial would
// if no address it resolves to may be dialled: the guard and the
// policy's rules for addresses (CheckResolved) judge each.
func (p *Proxy) checkName(ctx context.Context, pol *policy.Policy, name string, port uint16) error {
	ctx, cancel := context.WithTimeout(ctx, orDefault(p.DialTimeout, DefaultDialTimeout))
	defer cancel()
	var r netguard.Resolver = net.DefaultResolver
	if p.Resolver != nil {
		r = p.Resolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return err
	}
	var first error
	for _, a := range addrs {
		a = a.Unmap()
		err := p.Guard.Check(a, pol.AllowPrivateNetworks())
		if err == nil {
			err = pol.CheckResolved(name, netip.AddrPortFrom(a, port))
		}
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = &net.DNSError{Err: "no address", Name: name, IsNotFound: true}
	}
	return first
}
