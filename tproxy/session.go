package tproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// Reasons recorded for connections refused before or outside a policy
// decision.
const (
	ReasonUnknownSource = "connection from an unknown source"
	ReasonNotRedirected = "connection was not redirected (no original destination)"
	ReasonNoName        = "neither TLS nor HTTP, and the agent resolved no allowed name for this address"
	ReasonNoSNI         = "TLS without a server name"
	ReasonHelloTimeout  = "client sent nothing in time"
	ReasonHelloTooBig   = "ClientHello larger than the limit"
	ReasonClientClosed  = "client closed before sending anything"
	ReasonShuttingDown  = "proxy is shutting down"
	ReasonIdle          = "idle timeout"
	ReasonClosed        = "closed"
	ReasonIntercepted   = "intercepted"
	ReasonServerFirst   = "server spoke first"
	// ReasonRequestsUnseen refuses to splice a connection to a host whose
	// requests the policy must judge one by one: TLS when there is no
	// Interceptor to open it, or TCP that is neither TLS nor HTTP.
	ReasonRequestsUnseen = "the policy judges this host's requests, and this connection's cannot be seen"
	// The gateway's bounds on open connections, in all and per agent,
	// and the last quarter of all, kept for agents that hold few
	// (budget.Fair).
	ReasonTooManyConns      = "too many connections"
	ReasonAgentTooManyConns = "too many connections for this agent"
	ReasonConnsKept         = "the gateway is nearly full, and its last connections are kept for agents that hold few"
	reasonUpstreamPrefix    = "upstream: "
)

// BoundReasons are the reasons of refusals for the gateway's bounds on
// connections: those an agent causes by holding too many, which whoever
// counts refusals per agent counts however many other reasons it provokes.
func BoundReasons() []string {
	return []string{ReasonTooManyConns, ReasonAgentTooManyConns, ReasonConnsKept}
}

// target is where an allowed connection goes: a name resolved on the
// gateway, or (for address rules and open mode) the address itself.
type target struct {
	host     string     // canonical name, or "" to dial addr
	addr     netip.Addr // when host is ""
	port     uint16
	decision policy.Decision
}

func (t target) dialAddress() string {
	if t.host != "" {
		return net.JoinHostPort(t.host, strconv.Itoa(int(t.port)))
	}
	return netip.AddrPortFrom(t.addr, t.port).String()
}

func (t target) same(o target) bool { return t.host == o.host && t.addr == o.addr && t.port == o.port }

func (t target) label() string {
	if t.host != "" {
		return t.host
	}
	return t.addr.String()
}

// decideName judges a name (or an address in any spelling) on port; an
// invalid host is denied. The target is what the policy judged.
func decideName(pol *policy.Policy, name string, port uint16) (target, policy.Decision) {
	d := pol.Decide(name, port)
	return target{host: d.Name, addr: d.Addr, port: port, decision: d}, d
}

// decideAddr judges an address on port, by address rules and open mode.
func decideAddr(pol *policy.Policy, a netip.Addr, port uint16) (target, policy.Decision) {
	d := pol.DecideAddr(a, port)
	return target{addr: d.Addr, port: port, decision: d}, d
}

// decide judges a connection named host (may be "") to dst: by the name
// first, then, if no entry names it (or not on this port), by the
// address dialled. A name refused outright (a deny entry, a DNS-over-HTTPS
// resolver, DNS over TLS, an invalid name) stays refused, whatever its
// address, and so does a name whose requests the policy judges one by
// one (a deny request entry, an MCP endpoint): allowed by its address,
// they would go unseen. It returns the name's decision when both deny, so
// the reason names it.
func decide(pol *policy.Policy, host string, dst netip.AddrPort) (target, policy.Decision) {
	var nameDecision policy.Decision
	if host != "" {
		t, d := decideName(pol, host, dst.Port())
		if d.Allowed {
			return t, d
		}
		if !unlisted(d) || pol.JudgesRequests(host, dst.Port()) {
			// Refused outright, or a name whose requests the policy
			// judges: an address entry would carry them unseen.
			return target{}, d
		}
		nameDecision = d
	}
	if dst.Addr().IsValid() {
		t, d := decideAddr(pol, dst.Addr(), dst.Port())
		if d.Allowed || host == "" || !unlisted(d) {
			return t, d // without a name, or refused outright: the address's own reason
		}
	}
	if host == "" && nameDecision.Reason == "" {
		nameDecision.Reason = policy.ReasonNoRule
	}
	return target{}, nameDecision
}

// unlisted reports whether a denial only says that no entry names the
// destination (on its port), rather than refusing it outright.
func unlisted(d policy.Decision) bool {
	return d.Reason == policy.ReasonNoRule || d.Reason == policy.ReasonPortNotListed
}

// session is one client connection on its way to a decision: transparent,
// or an explicit proxy's CONNECT tunnel.
type session struct {
	p      *Proxy
	ctx    context.Context
	client net.Conn
	agent  string
	// pol is the agent's policy when the connection was accepted, which
	// judges where it goes; current is the agent's policy at any later
	// moment, which judges each request inside and a policy change.
	pol     *policy.Policy
	current policy.Current
	tracked *agentConn       // for Forget and Rejudge
	notes   *egresslog.Notes // what the gateway's work for it found (its lookups)
	src     netip.AddrPort
	dst     netip.AddrPort // original destination; for CONNECT to a name, only the port
	names   []string       // names to judge other TCP by
	kind    egresslog.Kind // KindConnect for tunnels; otherwise set by protocol
	start   time.Time
	// For a CONNECT tunnel: the target as the client asked, the name it
	// judged when the target is a name (what flows inside must name the
	// same), and the target dialled before the tunnel was answered.
	connectTarget string
	connectName   string
	predial       *predial
	// allowed is the connection run judged and dialled, for relay.
	allowed *allowed
}

// allowed is a connection judged and dialled, with what each side sent
// before, to be relayed. run leaves it to its caller, which relays it
// once the frames that judged it have returned: an open connection's
// goroutine then uses its stack only as deep as relay, and the garbage
// collector shrinks the stack that judging grew.
type allowed struct {
	kind                 egresslog.Kind
	up                   *net.TCPConn
	target               target
	clientBytes, upBytes []byte
}

// allow leaves the connection to up to be relayed when run returns.
func (s *session) allow(kind egresslog.Kind, up *net.TCPConn, t target, clientBytes, upBytes *[]byte) {
	s.allowed = &allowed{kind: kind, up: up, target: t, clientBytes: *clientBytes, upBytes: *upBytes}
	*clientBytes, *upBytes = nil, nil
}

// runAndRelay runs the session and relays the connection it allowed, if
// it allowed one.
func (s *session) runAndRelay(buffered []byte) {
	s.run(buffered)
	if a := s.allowed; a != nil {
		s.allowed = nil
		s.relay(a)
	}
}

// predial is a CONNECT target judged before the tunnel was answered, and
// its connection when it was dialled then (not for a host the Interceptor
// claims, which dials on its own).
type predial struct {
	target target
	conn   *net.TCPConn
}

// serveTransparent identifies, bounds and runs one redirected connection.
func (p *Proxy) serveTransparent(c net.Conn) {
	start := time.Now()
	src := addrPortOf(c.RemoteAddr())
	rec := egresslog.Record{Time: start, Kind: egresslog.KindTCP}
	agent, pol, ok := p.lookupAgent(src.Addr())
	if !ok {
		rec.Host, rec.Reason = src.Addr().String(), ReasonUnknownSource
		p.record(rec)
		reset(c)
		return
	}
	rec.Agent = agent
	release, why := p.acquire(agent, pol)
	if why != "" {
		rec.Reason = why
		p.record(rec)
		reset(c)
		return
	}
	defer release()
	notes := new(egresslog.Notes)
	ctx, cancel := context.WithCancel(egresslog.WithNotes(policy.WithAgent(p.baseCtx, agent), notes))
	defer cancel()
	tracked, untrack := p.trackAgentConn(agent, c, cancel)
	defer untrack()
	origDst := p.OriginalDst
	if origDst == nil {
		origDst = OriginalDst
	}
	dst, err := netip.AddrPort{}, error(ErrNotTCP)
	if tc, ok := tcpConnOf(c); ok {
		dst, err = origDst(tc)
	}
	if err != nil || dst == addrPortOf(c.LocalAddr()) {
		rec.Reason = ReasonNotRedirected
		p.record(rec)
		reset(c)
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	var names []string
	if p.Names != nil {
		names = p.Names(agent, dst.Addr())
	}
	s := &session{p: p, ctx: ctx, client: c, agent: agent, pol: pol, current: p.currentFor(agent, src.Addr()), tracked: tracked,
		notes: notes, src: src, dst: dst, names: names, start: start}
	s.runAndRelay(nil)
}

func (p *Proxy) lookupAgent(src netip.Addr) (string, *policy.Policy, bool) {
	if p.Agents == nil {
		return "", nil, false
	}
	return p.Agents(src)
}

// speculative returns the target to dial before the client speaks, if
// the connection would be allowed as other TCP (judgeRaw). Dialling early
// lets server-first protocols (SSH, SMTP, MySQL) work, and saves a round
// trip when the client does speak first.
func (s *session) speculative() (target, bool) {
	t, d := s.judgeRaw()
	return t, d.Allowed
}

// judgeRaw is the one decision for TCP that names no host of its own
// (neither TLS with a server name nor HTTP): by every name the agent
// resolved to the address, whatever the mode, then by the address. A name
// refused outright on this port (a deny entry, "!ssh.example.com:22")
// refuses the connection, whatever another name, "*" or open mode would
// allow; otherwise the first name allowed is the target (dialled by its
// resolution on the gateway), and else the address as address entries,
// "*" and open mode judge it.
func (s *session) judgeRaw() (target, policy.Decision) {
	var allowed *target
	for _, n := range s.names {
		t, d := decideName(s.pol, n, s.dst.Port())
		switch {
		case d.Allowed && allowed == nil:
			allowed = &t
		case !d.Allowed && !unlisted(d):
			t.host = n
			return t, d
		}
	}
	if allowed != nil {
		return *allowed, allowed.decision
	}
	if s.dst.Addr().IsValid() {
		if t, d := decideAddr(s.pol, s.dst.Addr(), s.dst.Port()); d.Allowed || !unlisted(d) {
			return t, d
		}
	}
	for _, n := range s.names {
		if t, d := decideName(s.pol, n, s.dst.Port()); !d.Allowed {
			t.host = n
			return t, d // the first name's reason: it names the destination
		}
	}
	return target{}, policy.Decision{Reason: ReasonNoName}
}

type readResult struct {
	buf []byte
	err error
}

type dialResult struct {
	conn *net.TCPConn
	err  error
}

// readInto reads once from c into the free capacity of buf, in a
// goroutine, and delivers the grown slice.
func readInto(c net.Conn, buf []byte) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		n, err := c.Read(buf[len(buf):cap(buf)])
		ch <- readResult{buf[:len(buf)+n], err}
	}()
	return ch
}

// firstBytesWait is how long a session waits in its own goroutine for a
// client that will speak a moment from now, before it waits on both
// sides in goroutines of their own.
const firstBytesWait = 2 * time.Millisecond

// readWithin reads what c sends within d into the free capacity of buf;
// nothing sent by then is no error.
func readWithin(c net.Conn, buf []byte, d time.Duration) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(d))
	n, err := c.Read(buf[len(buf):cap(buf)])
	c.SetReadDeadline(time.Time{})
	if isTimeout(err) {
		err = nil
	}
	return buf[:len(buf)+n], err
}

// stopRead ends a pending readInto on c and returns what it read.
func stopRead(c net.Conn, ch <-chan readResult) readResult {
	c.SetReadDeadline(time.Unix(1, 0))
	r := <-ch
	c.SetReadDeadline(time.Time{})
	return r
}

// speculation is the target a connection goes to if its bytes name no
// other, and the connection to it when it was dialled before the client
// spoke.
type speculation struct {
	s      *session
	target target
	ok     bool              // there is a speculative target
	dialc  chan dialResult   // the dial in flight, nil once received
	up     *net.TCPConn      // the connection once dialled
	upc    <-chan readResult // its pending first read, nil once stopped
	err    error             // the dial's error
	early  bool              // the dial was started before the client spoke
	lazy   bool              // hold the dial back for claimedDialDelay
	delay  *time.Timer       // the held-back dial's timer, while it runs
}

// claimedDialDelay is how long a silent client to a host the Interceptor
// claims waits before the target is dialled anyway. A TLS or HTTP client
// speaks at once, and the Interceptor dials on its own (an early
// connection would be thrown away); a client that waits for the server to
// speak first (SMTP, FTP, MySQL, a banner) gets its connection this much
// later.
const claimedDialDelay = 250 * time.Millisecond

// start dials the target in the background, while the client is silent.
func (sp *speculation) start() {
	if sp.up != nil && sp.upc == nil {
		sp.upc = readInto(sp.up, make([]byte, 0, 4096))
		return
	}
	if !sp.ok || sp.early {
		return
	}
	if sp.lazy {
		if sp.delay == nil {
			sp.delay = time.NewTimer(claimedDialDelay)
		}
		return
	}
	s := sp.s
	sp.early = true
	sp.dialc = make(chan dialResult, 1)
	go func(ch chan<- dialResult) {
		c, err := s.p.dial(s.ctx, s.pol, sp.target)
		ch <- dialResult{c, err}
	}(sp.dialc)
}

// dialled takes the dial's result; on success it starts reading, to learn
// whether the server speaks first.
func (sp *speculation) dialled(d dialResult) {
	sp.dialc = nil
	if d.err != nil {
		sp.err = d.err
		return
	}
	sp.up = d.conn
	sp.upc = readInto(sp.up, make([]byte, 0, 4096))
}

// take hands over the connection (dialling it now if it was not dialled
// early, or waiting for the dial) and whatever the server already sent.
func (sp *speculation) take() (*net.TCPConn, []byte, error) {
	if !sp.early {
		return sp.dialNow()
	}
	if sp.dialc != nil {
		sp.dialled(<-sp.dialc)
	}
	if sp.up == nil {
		if sp.err == nil {
			sp.err = errors.New("no connection")
		}
		return nil, nil, sp.err
	}
	var early []byte
	if sp.upc != nil {
		early = stopRead(sp.up, sp.upc).buf
		sp.upc = nil
	}
	c := sp.up
	sp.up = nil
	return c, early, nil
}

func (sp *speculation) dialNow() (*net.TCPConn, []byte, error) {
	if !sp.ok {
		return nil, nil, errors.New("no target")
	}
	c, err := sp.s.p.dial(sp.s.ctx, sp.s.pol, sp.target)
	return c, nil, err
}

// delayed is the held-back dial's channel, nil (never ready) when there
// is none.
func (sp *speculation) delayed() <-chan time.Time {
	if sp.delay == nil {
		return nil
	}
	return sp.delay.C
}

// discard closes the speculative connection, now or when its dial ends.
func (sp *speculation) discard() {
	if sp.delay != nil {
		sp.delay.Stop()
		sp.delay = nil
	}
	if sp.dialc != nil {
		go func(ch <-chan dialResult) {
			if r := <-ch; r.conn != nil {
				r.conn.Close()
			}
		}(sp.dialc)
		sp.dialc = nil
	}
	if sp.up != nil {
		sp.up.Close() // also ends a pending first read
		sp.up, sp.upc = nil, nil
	}
}

// run reads the client's first bytes (after buffered, which a CONNECT
// client may have sent early) and hands the connection to the path its
// protocol takes; one to be relayed it leaves in s.allowed, for
// runAndRelay. While the client is silent it dials the speculative
// target, so that a server that speaks first can.
func (s *session) run(buffered []byte) {
	sp := speculation{s: s}
	switch {
	case s.predial != nil && s.predial.conn != nil:
		// Dialled already; whether the server speaks first is read for
		// only if the client does not.
		sp.target, sp.ok, sp.early, sp.up = s.predial.target, true, true, s.predial.conn
	case s.predial != nil:
		sp.target, sp.ok, sp.lazy = s.predial.target, true, true
	default:
		sp.target, sp.ok = s.speculative()
		// A host the Interceptor claims is dialled by the Interceptor:
		// a connection dialled early would be thrown away.
		sp.lazy = sp.ok && s.p.intercepts(s.agent, sp.target)
	}
	defer sp.discard()

	buf := make([]byte, len(buffered), max(4096, len(buffered)))
	copy(buf, buffered)
	var clientErr error
	switch {
	case sniff(buf) != protoUnknown:
	case sp.early:
		// A CONNECT client speaks once the 200 reaches it, a moment
		// from now: waited for here, its first bytes cost no reader
		// goroutines (a server that speaks first waits that moment).
		buf, clientErr = readWithin(s.client, buf, firstBytesWait)
	default:
		// Most clients have spoken by the time they are accepted: read
		// without waiting first, and dial and wait in goroutines only if
		// not.
		buf, clientErr = readNow(s.client, buf)
	}
	if sniff(buf) == protoUnknown && clientErr == nil {
		if d := s.pol.DecidePort(s.dst.Port()); !sp.ok && !d.Allowed {
			// Nothing the client could say would be allowed on this
			// port: no reason to hold it until it speaks.
			s.deny(target{}, d, "")
			return
		}
		if sp.ok {
			s.client.SetReadDeadline(time.Now().Add(orDefault(s.p.IdleTimeout, DefaultIdleTimeout)))
		} else {
			s.client.SetReadDeadline(time.Now().Add(orDefault(s.p.HelloTimeout, DefaultHelloTimeout)))
		}
		sp.start()
		clientc := readInto(s.client, buf)
	wait:
		for {
			select {
			case <-s.p.closedCh:
				stopRead(s.client, clientc)
				s.deny(target{}, policy.Decision{Reason: ReasonShuttingDown}, "")
				return
			case r := <-clientc:
				buf, clientErr = r.buf, r.err
				if clientErr == nil && sniff(buf) == protoUnknown && len(buf) < cap(buf) {
					clientc = readInto(s.client, buf)
					continue
				}
				break wait
			case <-sp.delayed():
				sp.delay, sp.lazy = nil, false
				sp.start()
			case d := <-sp.dialc:
				sp.dialled(d) // on failure, a TLS or HTTP client may still name another host
			case r := <-sp.upc:
				sp.upc = nil
				cr := stopRead(s.client, clientc)
				if len(r.buf) == 0 {
					s.deny(sp.target, sp.target.decision, reasonUpstreamPrefix+errString(r.err))
					return
				}
				// The server spoke first: other TCP, judged by the
				// speculative target already.
				up, _, _ := sp.take()
				s.allow(kindOr(s.kind, egresslog.KindTCP), up, sp.target, &cr.buf, &r.buf)
				return
			}
		}
	}
	s.client.SetReadDeadline(time.Time{})

	if len(buf) == 0 {
		switch {
		case isTimeout(clientErr) && sp.ok:
			// Neither side spoke within the idle timeout.
			s.deny(sp.target, sp.target.decision, ReasonIdle)
			return
		case isTimeout(clientErr):
			// Silent to the end: judged as other TCP, so that a name
			// refused outright says so rather than that nobody spoke.
			if t, d := s.judgeRaw(); d.Reason != ReasonNoName {
				s.deny(t, d, "")
				return
			}
			s.deny(target{}, policy.Decision{Reason: ReasonHelloTimeout}, "")
			return
		case !sp.ok:
			s.deny(target{}, policy.Decision{Reason: ReasonClientClosed}, "")
			return
		}
		// The client half-closed without a word: a server that speaks
		// first still gets the connection.
	}

	proto := sniff(buf)
	if proto == protoUnknown && len(buf) > 0 && !errors.Is(clientErr, io.EOF) {
		// A first line of text that had not ended when the client
		// paused or filled the buffer may go on as a request line:
		// judged as HTTP, where what is not HTTP is refused. (One the
		// client ended the stream on is no request a server takes: a
		// request's head ends with an empty line.)
		proto = protoHTTP
	}
	switch proto {
	case protoTLS:
		s.serveTLS(&buf, &sp)
	case protoHTTP:
		sp.discard()
		s.p.handoffHTTP(s, buf)
	default:
		if !sp.ok {
			t, d := s.judgeRaw()
			s.deny(t, d, "")
			return
		}
		up, early, err := sp.take()
		if err != nil {
			s.dialFailed(egresslog.KindTCP, sp.target, err)
			return
		}
		s.allow(kindOr(s.kind, egresslog.KindTCP), up, sp.target, &buf, &early)
	}
}

// serveTLS reads the whole ClientHello, judges its server name, and
// intercepts, splices or refuses. It takes the caller's buffer (*bufp,
// set to nil), so that only relay's hold on it remains while the
// connection is open.
func (s *session) serveTLS(bufp *[]byte, sp *speculation) {
	buf := *bufp
	*bufp = nil
	maxHello := orDefault(s.p.MaxHelloSize, DefaultMaxHelloSize)
	s.client.SetReadDeadline(time.Now().Add(orDefault(s.p.HelloTimeout, DefaultHelloTimeout)))
	for {
		done, err := helloComplete(buf)
		if err != nil {
			s.denyTLS(target{}, policy.Decision{Reason: err.Error()})
			return
		}
		if done {
			break
		}
		if len(buf) >= maxHello {
			s.denyTLS(target{}, policy.Decision{Reason: ReasonHelloTooBig})
			return
		}
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, min(cap(buf), maxHello-len(buf)))...)[:len(buf)]
		}
		n, err := s.client.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil && n == 0 {
			s.denyTLS(target{}, policy.Decision{Reason: "reading ClientHello: " + errString(err)})
			return
		}
	}
	s.client.SetReadDeadline(time.Time{})
	hello, err := parseHello(buf)
	if err != nil {
		s.denyTLS(target{}, policy.Decision{Reason: err.Error()})
		return
	}
	var t target
	var d policy.Decision
	switch {
	case s.connectName != "":
		// A tunnel to a name carries TLS for that name, or none.
		if name, err := hostname.Normalize(hello.serverName); hello.serverName != "" && (err != nil || name != s.connectName) {
			s.denyTLS(target{host: hello.serverName, port: s.dst.Port()}, policy.Decision{Reason: ReasonTargetMismatch})
			return
		}
		t, d = sp.target, sp.target.decision
	case hello.serverName == "":
		t, d = s.judgeRaw() // no name of its own
	default:
		t, d = decide(s.pol, hello.serverName, s.dst)
		t, d = s.p.askFor(s.ctx, s.agent, s.current, t, d, s.dst.Port(), egresslog.KindTLS)
	}
	if !d.Allowed {
		if hello.serverName == "" && (d.Reason == policy.ReasonNoRule || d.Reason == ReasonNoName) {
			d.Reason = ReasonNoSNI
		}
		s.denyTLS(target{host: hello.serverName, port: s.dst.Port()}, d)
		return
	}
	if s.p.intercepts(s.agent, t) {
		sp.discard()
		s.intercept(t, buf)
		return
	}
	var up *net.TCPConn
	var early []byte
	if sp.ok && t.same(sp.target) {
		up, early, err = sp.take()
	} else {
		sp.discard()
		up, err = s.p.dial(s.ctx, s.pol, t)
	}
	if err != nil {
		s.dialFailed(egresslog.KindTLS, t, err)
		return
	}
	s.allow(kindOr(s.kind, egresslog.KindTLS), up, t, &buf, &early)
}

func kindOr(k, def egresslog.Kind) egresslog.Kind {
	if k != "" {
		return k
	}
	return def
}

// baseRecord is the record of this session for target t.
func (s *session) baseRecord(kind egresslog.Kind, t target, d policy.Decision) egresslog.Record {
	host := t.label()
	if t.host == "" && !t.addr.IsValid() {
		host = s.dst.Addr().String()
		if !s.dst.Addr().IsValid() && len(s.names) > 0 {
			host = s.names[0]
		}
	}
	return egresslog.Record{
		Time: s.start, Agent: s.agent, Kind: kind, Host: host, Port: s.dst.Port(), Target: s.connectTarget,
		Allowed: d.Allowed, Report: d.Report, Reason: d.Reason, Rule: d.Rule,
	}
}

// deny records a refusal and resets the client.
func (s *session) deny(t target, d policy.Decision, why string) {
	r := s.baseRecord(kindOr(s.kind, egresslog.KindTCP), t, d)
	r.Allowed, r.Report = false, false
	if why != "" {
		r.Reason = why
	}
	r.Duration = time.Since(s.start)
	r.Reason = s.notes.Annotate(s.refusal(r.Reason))
	s.p.record(r)
	reset(s.client)
}

// tlsAccessDenied is a fatal TLS alert, access_denied, so that the client
// reports a refusal rather than a broken connection.
var tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}

func (s *session) denyTLS(t target, d policy.Decision) {
	r := s.baseRecord(kindOr(s.kind, egresslog.KindTLS), t, d)
	r.Allowed, r.Report = false, false
	r.Duration = time.Since(s.start)
	r.Reason = s.notes.Annotate(s.refusal(r.Reason))
	s.p.record(r)
	s.client.SetWriteDeadline(time.Now().Add(time.Second))
	s.client.Write(tlsAccessDenied)
	s.client.Close()
}

// dialFailed records a failed upstream dial and resets the client at once,
// so that a refused upstream is a refused connection.
func (s *session) dialFailed(kind egresslog.Kind, t target, err error) {
	r := s.baseRecord(kindOr(s.kind, kind), t, t.decision)
	r.Allowed = false
	r.Reason = s.notes.Annotate(s.refusal(reasonUpstreamPrefix + err.Error()))
	r.Duration = time.Since(s.start)
	s.p.record(r)
	reset(s.client)
}

// refusal is why the connection is refused: why, unless its agent was
// forgotten, which is then what ended it (its client reset, its dial
// cancelled), whatever that made the session see.
func (s *session) refusal(why string) string {
	if s.tracked != nil && s.tracked.gone() {
		return ReasonForgotten
	}
	return why
}

// askFor asks the Approver about a connection or request the policy
// would refuse for want of an entry (policy.Ask), holding it until an
// answer: the one place tproxy asks. An approved name is dialled by the
// name, as an allowed one is.
func (p *Proxy) askFor(ctx context.Context, agent string, current policy.Current, t target, d policy.Decision, port uint16, kind egresslog.Kind) (target, policy.Decision) {
	if p.Approver == nil || !d.Askable {
		return t, d
	}
	if d = policy.Ask(ctx, p.Approver, agent, d, port, string(kind), current); d.Allowed {
		t = target{host: d.Name, port: port, decision: d}
	}
	return t, d
}

// intercepts reports whether TLS to t goes to the Interceptor: a host it
// claims (a credential's), or one whose requests the policy judges one by
// one (without an Interceptor, relay refuses those).
func (p *Proxy) intercepts(agent string, t target) bool {
	return t.host != "" && p.Interceptor != nil && (t.decision.Requests || p.Interceptor.Claims(agent, t.host))
}

// intercept hands the connection, with the ClientHello already read, to
// the Interceptor, and records it, open until the Interceptor returns. Its
// context carries the connection's ID, which links the records of the
// requests inside to it.
func (s *session) intercept(t target, hello []byte) {
	c := s.paced(newPrefixConn(s.client, hello))
	r := s.baseRecord(kindOr(s.kind, egresslog.KindTLS), t, t.decision)
	ctx, cancel := context.WithCancel(s.p.dialContext(s.ctx))
	defer cancel()
	// Each request the Interceptor forwards is one of the agent's, as a
	// plain HTTP request is, for Forget and Rejudge to find.
	ctx = policy.WithInFlight(ctx, func(end func(string), rejudge func() string) (func(), bool) {
		ac, untrack := s.p.trackAgentConn(s.agent, nil, nil)
		done, refused := ac.moving(end, rejudge)
		return func() { done(); untrack() }, refused
	})
	ended := &ending{stop: func() { cancel(); reset(s.client) }}
	held := &intercepted{c: c, end: ended.end}
	s.p.relays.add(held)
	defer s.p.relays.remove(held)
	if s.tracked != nil {
		done, refused := s.tracked.moving(ended.end, func() string { return rejudgeIntercepted(s.current(), t) })
		defer done()
		if refused { // by a policy or a Forget that came while it was judged
			why, _ := ended.reason()
			r.Allowed, r.Rule, r.Reason = false, "", s.notes.Annotate(why)
			s.p.record(r)
			return
		}
	}
	var conn *egresslog.Conn
	if s.p.Log != nil {
		conn = s.p.Log.Begin(r)
		ctx = egresslog.WithConnID(ctx, conn.ID())
	}
	err := s.p.Interceptor.Intercept(ctx, c, s.agent, s.current, t.host, t.port)
	c.Close()
	var quota *policy.QuotaError
	why, stopped := ended.reason()
	switch {
	case stopped:
		r.Reason = why
	case errors.As(err, &quota):
		r.Allowed, r.Reason = false, quota.Reason
	case err != nil:
		r.Reason = ReasonIntercepted + ": " + err.Error()
	default:
		r.Reason = ReasonIntercepted
	}
	r.BytesUp, r.BytesDown = c.read.Load(), c.written.Load()
	r.Duration = time.Since(s.start)
	r.Reason = s.notes.Annotate(r.Reason)
	if conn != nil {
		conn.End(r)
	}
}

// intercepted is a connection the Interceptor holds, as the idle sweep
// and a forced shutdown find it: its bytes pass c, whoever moves them.
type intercepted struct {
	c   *prefixConn
	end func(why string)
}

func (i *intercepted) idle() time.Duration { return i.c.idle() }
func (i *intercepted) abort(why string)    { i.end(why) }

// paced holds c to the agent's byte quotas.
func (s *session) paced(c *prefixConn) *prefixConn {
	q := s.pol.Quotas()
	c.paceUp = s.p.pacer(&s.p.bytesUp, s.agent, q.BytesPerSecondUp)
	c.paceDown = s.p.pacer(&s.p.bytesDown, s.agent, q.BytesPerSecondDown)
	return c
}

// dialContext carries the proxy's Guard and Resolver, for the
// Interceptor's dials when it has none of its own.
func (p *Proxy) dialContext(ctx context.Context) context.Context {
	if p.Guard != nil {
		ctx = netguard.WithGuard(ctx, p.Guard)
	}
	if p.Resolver != nil {
		ctx = netguard.WithResolver(ctx, p.Resolver)
	}
	return ctx
}

// dial connects to t through netguard, resolving names on the gateway.
func (p *Proxy) dial(ctx context.Context, pol *policy.Policy, t target) (*net.TCPConn, error) {
	d := netguard.Dialer{
		Guard:        p.Guard,
		AllowPrivate: pol.AllowPrivateNetworks(),
		Resolver:     p.Resolver,
		Timeout:      orDefault(p.DialTimeout, DefaultDialTimeout),
		KeepAlive:    -1,
		Check: func(_ context.Context, host string, ap netip.AddrPort) error {
			return pol.CheckResolved(host, ap)
		},
	}
	c, err := d.DialContext(ctx, "tcp", t.dialAddress())
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("tproxy: dial %s: not a TCP connection", t.dialAddress())
	}
	return tc, nil
}

// reset closes c with a TCP RST rather than a FIN, where c is TCP.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// ErrNotTCP means a connection has no TCP connection beneath it, so its
// original destination cannot be read.
var ErrNotTCP = errors.New("tproxy: not a TCP connection")

// tcpConnOf finds the *net.TCPConn beneath c, unwrapping connections that
// expose it with NetConn (as crypto/tls and many listeners' wrappers do).
// It is for reading socket facts, never for moving bytes past a wrapper.
func tcpConnOf(c net.Conn) (*net.TCPConn, bool) {
	for range 8 {
		switch v := c.(type) {
		case *net.TCPConn:
			return v, true
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil, false
		}
	}
	return nil, false
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func errString(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}
