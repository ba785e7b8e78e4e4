package tproxy

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/agenthold/egress/policy"
)

// ReasonPolicyChanged prefixes why a spliced connection was ended when
// its agent's policy came to refuse its destination.
const ReasonPolicyChanged = "policy changed: "

// ReasonForgotten is why a connection of an agent the proxy was told to
// forget (Forget) was ended or refused.
const ReasonForgotten = "the agent was forgotten (removed, or its credentials revoked)"

// agentConn is one of an agent's connections (or, for plain HTTP, one
// request), as Forget and Rejudge find it, from the moment its agent is
// known: while it is judged, dialled or waits for an approval, and while
// its bytes move. It is the one place both look: whatever moves a
// connection's bytes (a relay, spliced or on the kernel path; the
// Interceptor; the HTTP forwarder, an upgrade's tunnel too) registers
// with it as it starts (moving), and is judged there again, by its
// agent's policy as it is then, so that a change that came while it was
// judged, and that Rejudge could not yet see, still ends it; and a
// connection forgotten before then never starts.
type agentConn struct {
	mu sync.Mutex
	// conn is the client connection (a CONNECT's, once answered; none
	// for a plain HTTP request, whose connection may carry others').
	conn net.Conn
	// cancel ends the connection's judging and dialling.
	cancel context.CancelFunc
	// forgotten: Forget came; nothing more of the connection may start.
	forgotten bool
	// While its bytes move: what ends them, saying why, and why its
	// agent's policy now refuses them ("" if it does not).
	end     func(why string)
	rejudge func() string
}

// answered notes the client connection of a CONNECT, once it is taken
// over, and what ends its tunnel's work from then on; false, and c
// reset, if the agent was forgotten meanwhile.
func (ac *agentConn) answered(c net.Conn, cancel context.CancelFunc) bool {
	ac.mu.Lock()
	ac.conn, ac.cancel = c, cancel
	forgotten := ac.forgotten
	ac.mu.Unlock()
	if forgotten {
		reset(c)
	}
	return !forgotten
}

// gone reports whether the connection's agent was forgotten.
func (ac *agentConn) gone() bool {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	return ac.forgotten
}

// moving notes what ends the connection's bytes and how to judge them
// again, until the returned function is called, and judges them once
// now: Rejudge looks only at what moves, and the policy may have changed
// since the connection was judged. A connection refused now, or
// forgotten, is ended (end, with why) before a byte of it moves
// (refused), and is to be recorded so.
func (ac *agentConn) moving(end func(why string), rejudge func() string) (done func(), refused bool) {
	ac.mu.Lock()
	ac.end, ac.rejudge = end, rejudge
	forgotten := ac.forgotten
	ac.mu.Unlock()
	if forgotten {
		end(ReasonForgotten)
		refused = true
	} else if why := rejudge(); why != "" {
		end(ReasonPolicyChanged + why)
		refused = true
	}
	return func() {
		ac.mu.Lock()
		ac.end, ac.rejudge = nil, nil
		ac.mu.Unlock()
	}, refused
}

// movingNow is what moves a connection's bytes at a moment.
type movingNow struct {
	end     func(why string)
	rejudge func() string
}

// movingIn is what moves the bytes of acs now: requests (which carry no
// client connection of their own) before the connections that may carry
// them, so that each request is ended before what carries it, and says
// why it ended rather than end by the other's reset.
func movingIn(acs []*agentConn) []movingNow {
	var inner, outer []movingNow
	for _, ac := range acs {
		ac.mu.Lock()
		m, carries := movingNow{ac.end, ac.rejudge}, ac.conn != nil
		ac.mu.Unlock()
		switch {
		case m.end == nil:
		case carries:
			outer = append(outer, m)
		default:
			inner = append(inner, m)
		}
	}
	return append(inner, outer...)
}

// endConn ends the rest of a forgotten connection: its judging and
// dialling, its client connection.
func (ac *agentConn) endConn() {
	ac.mu.Lock()
	c, cancel := ac.conn, ac.cancel
	ac.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if c != nil {
		reset(c)
	}
}

// ending is why something moving a connection's bytes was ended (the
// first reason given) and what ends it, for those that keep no reason
// of their own.
type ending struct {
	why  atomic.Pointer[string]
	stop func()
}

func (e *ending) end(why string) {
	e.why.CompareAndSwap(nil, &why)
	e.stop()
}

// reason is why it was ended, and whether it was.
func (e *ending) reason() (string, bool) {
	if why := e.why.Load(); why != nil {
		return *why, true
	}
	return "", false
}

// connSet is an agent's connections. Once Forget has taken it (closed),
// it takes no more: a connection tracked then goes into the agent's next
// set, which a later Forget finds.
type connSet struct {
	mu     sync.Mutex
	m      map[*agentConn]struct{}
	closed bool
}

// add puts ac in the set, unless Forget has taken it.
func (set *connSet) add(ac *agentConn) bool {
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.closed {
		return false
	}
	set.m[ac] = struct{}{}
	return true
}

// close takes the set for Forget: it takes no more connections, and
// those it has are all forgotten before any is ended, so that one ended
// first (a connection) finds another it carries (a request on it)
// forgotten already, whichever way that one ends.
func (set *connSet) close() []*agentConn {
	set.mu.Lock()
	set.closed = true
	set.mu.Unlock()
	acs := set.snapshot()
	for _, ac := range acs {
		ac.mu.Lock()
		ac.forgotten = true
		ac.mu.Unlock()
	}
	return acs
}

func (set *connSet) snapshot() []*agentConn {
	set.mu.Lock()
	defer set.mu.Unlock()
	out := make([]*agentConn, 0, len(set.m))
	for ac := range set.m {
		out = append(out, ac)
	}
	return out
}

// agentSet is agent's set of connections, made if it has none.
func (p *Proxy) agentSet(agent string) *connSet {
	v, ok := p.agentConns.Load(agent)
	if !ok {
		v, _ = p.agentConns.LoadOrStore(agent, &connSet{m: map[*agentConn]struct{}{}})
	}
	return v.(*connSet)
}

// trackAgentConn remembers a connection as one of agent's, for Forget
// and Rejudge, until untrack is called: c is its client connection (nil
// for a CONNECT not yet answered: see answered), cancel ends its judging
// and dialling.
func (p *Proxy) trackAgentConn(agent string, c net.Conn, cancel context.CancelFunc) (ac *agentConn, untrack func()) {
	ac = &agentConn{conn: c, cancel: cancel}
	set := p.agentSet(agent)
	for !set.add(ac) { // taken by a Forget under way: the agent's next set
		set = p.agentSet(agent)
	}
	return ac, func() {
		set.mu.Lock()
		delete(set.m, ac)
		set.mu.Unlock()
	}
}

// Forget ends every connection the proxy holds for agent: its tunnels,
// its spliced and intercepted connections, its requests being forwarded
// (plain HTTP, or by the Interceptor), and those still being judged,
// dialled or waiting for an approval; and drops its rates, so that an
// agent made later under its name starts with whole bursts. Call it when
// an agent is removed, or its credentials revoked: what it opened before
// must not outlive it.
func (p *Proxy) Forget(agent string) {
	// Its kept-alive upstream connections first: none may carry a request
	// of the agent's from now on.
	p.pools.Forget(agent)
	p.poolsH2C.Forget(agent)
	if v, ok := p.agentConns.LoadAndDelete(agent); ok { // a removed agent's set goes with it
		acs := v.(*connSet).close()
		// What moves bytes first, all found before any ends, so that each
		// says why it ended; a relay's upstream too, whatever its client's
		// side is doing.
		for _, m := range movingIn(acs) {
			m.end(ReasonForgotten)
		}
		for _, ac := range acs {
			ac.endConn()
		}
	}
	// Its rates last, once its connections are told to end: an agent made
	// later under the same name does not inherit what this one spent (but
	// for what a relay ending meanwhile charges as it stops).
	p.connRates.Forget(agent)
	p.bytesUp.Forget(agent)
	p.bytesDown.Forget(agent)
}

// Rejudge judges again what moves agent's bytes, by the policy its
// source (or its credentials) now finds, and ends what that refuses: a
// spliced connection (its destination), an intercepted one (its host;
// its requests are judged one by one anyway), a plain HTTP request being
// forwarded, a long stream or an upgrade's tunnel (its host, method and
// path). Call it when an agent's policy changes: what was opened before
// the change must not keep what the change took away.
func (p *Proxy) Rejudge(agent string) {
	v, ok := p.agentConns.Load(agent)
	if !ok {
		return
	}
	for _, m := range movingIn(v.(*connSet).snapshot()) {
		if why := m.rejudge(); why != "" {
			m.end(ReasonPolicyChanged + why)
		}
	}
}

// currentFor is agent's policy as its source address finds it at each
// call: nil once the address belongs to another agent, or to none.
func (p *Proxy) currentFor(agent string, src netip.Addr) policy.Current {
	return func() *policy.Policy {
		a, pol, ok := p.lookupAgent(src)
		if !ok || a != agent {
			return nil
		}
		return pol
	}
}

// refusedNow says why pol refuses t now as a destination ("" if it
// does not), and whether it would have its requests judged.
func refusedNow(pol *policy.Policy, t target) (why string, requests bool) {
	if pol == nil {
		return policy.ReasonNoPolicy, false
	}
	var d policy.Decision
	if t.host != "" {
		d = pol.Decide(t.host, t.port)
	} else {
		d = pol.DecideAddr(t.addr, t.port)
	}
	if !d.Allowed {
		if t.decision.Approved && d.Askable {
			return "", false // approved, and still the approver's to decide
		}
		return d.Reason, false
	}
	return "", d.Requests
}

// rejudgeSpliced says why pol refuses now a spliced connection to t,
// dialled at up, or "".
func rejudgeSpliced(pol *policy.Policy, t target, up netip.AddrPort) string {
	why, requests := refusedNow(pol, t)
	if why != "" {
		return why
	}
	if requests { // its requests must now be seen, and a spliced connection's are not
		return ReasonRequestsUnseen
	}
	if err := pol.CheckResolved(t.host, up); err != nil {
		return err.Error()
	}
	return ""
}

// rejudgeIntercepted says why pol refuses now an intercepted connection
// to t, or "": its host, since the Interceptor judges its requests.
func rejudgeIntercepted(pol *policy.Policy, t target) string {
	why, _ := refusedNow(pol, t)
	return why
}

// rejudgeRequest says why pol refuses now a plain HTTP request to t,
// being forwarded, or "": by its host, and where request entries judge
// it, as judged was decided of it (policy.DecideAgain: its method, path,
// override methods and MCP messages, its body gone on).
func rejudgeRequest(pol *policy.Policy, t target, judged policy.Decision) string {
	why, requests := refusedNow(pol, t)
	if why != "" || !requests || t.decision.Approved { // an approval allows a name no entry names, nor judges
		return why
	}
	if d := pol.DecideAgain(judged); !d.Allowed {
		return d.Reason
	}
	return ""
}
