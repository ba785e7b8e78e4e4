package tproxy

import (
	"context"
	"net"
	"net/netip"
	"sync"

	"github.com/agenthold/egress/policy"
)

// ReasonPolicyChanged prefixes why a spliced connection was ended when
// its agent's policy came to refuse its destination.
const ReasonPolicyChanged = "policy changed: "

// ReasonForgotten is why a connection of an agent the proxy was told to
// forget (Forget) was ended or refused.
const ReasonForgotten = "the agent was forgotten (removed, or its credentials revoked)"

// agentConn is one of an agent's connections, as Forget and Rejudge find
// it, from the moment it is identified: while it is judged, dialled or
// waits for an approval, and while it is relayed. It is the one place
// both look: a connection that reaches its relay is judged again there,
// by its agent's policy as it is then (spliced), so that a change that
// came while it was judged, and that Rejudge could not yet see, still
// ends it; and a connection forgotten before then never starts.
type agentConn struct {
	mu sync.Mutex
	// conn is the client connection (a CONNECT's, once answered).
	conn net.Conn
	// cancel ends the connection's judging and dialling.
	cancel context.CancelFunc
	// forgotten: Forget came; nothing more of the connection may start.
	forgotten bool
	// While the connection is spliced: its relay, and why the agent's
	// policy now refuses the relay's destination ("" if it does not).
	relay   *relay
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

// spliced notes the connection's relay and how to judge it again, until
// the returned function is called, and judges it once now: Rejudge
// looks only at relays it can see, and the policy may have changed since
// the connection was judged. A connection refused now, or forgotten, is
// aborted before a byte of it moves (refused), and is to be recorded so.
func (ac *agentConn) spliced(r *relay, rejudge func() string) (done func(), refused bool) {
	ac.mu.Lock()
	ac.relay, ac.rejudge = r, rejudge
	forgotten := ac.forgotten
	ac.mu.Unlock()
	if forgotten {
		r.abort(ReasonForgotten)
		refused = true
	} else if why := rejudge(); why != "" {
		r.abort(ReasonPolicyChanged + why)
		refused = true
	}
	return func() {
		ac.mu.Lock()
		ac.relay, ac.rejudge = nil, nil
		ac.mu.Unlock()
	}, refused
}

// forget ends the connection, whatever it is doing: its judging and
// dialling, its relay, its client connection.
func (ac *agentConn) forget() {
	ac.mu.Lock()
	ac.forgotten = true
	c, cancel, r := ac.conn, ac.cancel, ac.relay
	ac.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if r != nil {
		r.abort(ReasonForgotten) // both sides: the upstream too, whatever the client's side is doing
	}
	if c != nil {
		reset(c)
	}
}

// connSet is an agent's connections.
type connSet struct {
	mu sync.Mutex
	m  map[*agentConn]struct{}
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

// trackAgentConn remembers a connection as one of agent's, for Forget
// and Rejudge, until untrack is called: c is its client connection (nil
// for a CONNECT not yet answered: see answered), cancel ends its judging
// and dialling.
func (p *Proxy) trackAgentConn(agent string, c net.Conn, cancel context.CancelFunc) (ac *agentConn, untrack func()) {
	v, ok := p.agentConns.Load(agent)
	if !ok {
		v, _ = p.agentConns.LoadOrStore(agent, &connSet{m: map[*agentConn]struct{}{}})
	}
	set := v.(*connSet)
	ac = &agentConn{conn: c, cancel: cancel}
	set.mu.Lock()
	set.m[ac] = struct{}{}
	set.mu.Unlock()
	return ac, func() {
		set.mu.Lock()
		delete(set.m, ac)
		set.mu.Unlock()
	}
}

// Forget ends every connection the proxy holds for agent: its tunnels,
// its spliced and intercepted connections, and those still being judged,
// dialled or waiting for an approval. Call it when an agent is removed,
// or its credentials revoked: what it opened before must not outlive it.
func (p *Proxy) Forget(agent string) {
	v, ok := p.agentConns.LoadAndDelete(agent) // a removed agent's set goes with it
	if !ok {
		return
	}
	for _, ac := range v.(*connSet).snapshot() {
		ac.forget()
	}
}

// Rejudge judges agent's spliced connections again, by the policy its
// source now finds, and ends those whose destination it refuses. Call it
// when an agent's policy changes: a connection opened before the change
// must not keep what the change took away. (HTTP requests, plain or
// intercepted, are judged one by one anyway.)
func (p *Proxy) Rejudge(agent string) {
	v, ok := p.agentConns.Load(agent)
	if !ok {
		return
	}
	for _, ac := range v.(*connSet).snapshot() {
		ac.mu.Lock()
		r, rejudge := ac.relay, ac.rejudge
		ac.mu.Unlock()
		if r == nil {
			continue
		}
		if why := rejudge(); why != "" {
			r.abort(ReasonPolicyChanged + why)
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

// rejudgeTarget says why pol refuses t now, dialled at up, or "".
func rejudgeTarget(pol *policy.Policy, t target, up netip.AddrPort) string {
	if pol == nil {
		return policy.ReasonNoPolicy
	}
	var d policy.Decision
	if t.host != "" {
		d = pol.Decide(t.host, t.port)
	} else {
		d = pol.DecideAddr(t.addr, t.port)
	}
	if !d.Allowed {
		if t.decision.Approved && d.Askable {
			return "" // approved, and still the approver's to decide
		}
		return d.Reason
	}
	if d.Requests { // its requests must now be seen, and a spliced connection's are not
		return ReasonRequestsUnseen
	}
	if err := pol.CheckResolved(t.host, up); err != nil {
		return err.Error()
	}
	return ""
}
