package tproxy

import (
	"net"
	"net/netip"
	"sync"

	"github.com/agenthold/egress/policy"
)

// ReasonPolicyChanged prefixes why a spliced connection was ended when
// its agent's policy came to refuse its destination.
const ReasonPolicyChanged = "policy changed: "

// agentConn is one of an agent's client connections, as Forget and
// Rejudge find it.
type agentConn struct {
	conn net.Conn
	mu   sync.Mutex
	// While the connection is spliced: its relay, and why the agent's
	// policy now refuses the relay's destination ("" if it does not).
	relay   *relay
	rejudge func() string
}

// spliced notes the connection's relay and how to judge it again, until
// the returned function is called.
func (ac *agentConn) spliced(r *relay, rejudge func() string) (done func()) {
	ac.mu.Lock()
	ac.relay, ac.rejudge = r, rejudge
	ac.mu.Unlock()
	return func() {
		ac.mu.Lock()
		ac.relay, ac.rejudge = nil, nil
		ac.mu.Unlock()
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

// trackAgentConn remembers c as one of agent's, for Forget and
// Rejudge, until untrack is called.
func (p *Proxy) trackAgentConn(agent string, c net.Conn) (ac *agentConn, untrack func()) {
	v, ok := p.agentConns.Load(agent)
	if !ok {
		v, _ = p.agentConns.LoadOrStore(agent, &connSet{m: map[*agentConn]struct{}{}})
	}
	set := v.(*connSet)
	ac = &agentConn{conn: c}
	set.mu.Lock()
	set.m[ac] = struct{}{}
	set.mu.Unlock()
	return ac, func() {
		set.mu.Lock()
		delete(set.m, ac)
		set.mu.Unlock()
	}
}

// Forget closes every connection the proxy holds for agent: its
// tunnels and its spliced and intercepted connections. Call it when an
// agent is removed, or its credentials revoked: what it opened before
// must not outlive it.
func (p *Proxy) Forget(agent string) {
	v, ok := p.agentConns.LoadAndDelete(agent) // a removed agent's set goes with it
	if !ok {
		return
	}
	for _, ac := range v.(*connSet).snapshot() {
		reset(ac.conn)
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
