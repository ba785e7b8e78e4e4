package httpfwd

import "sync"

// Pools keeps each agent's own upstream connections, for the policy they
// were dialled under. A dial checks each address against the policy of
// the request it is for (Config.Check), and a kept-alive connection is
// not dialled again: shared between agents, one agent's request would
// ride a connection another's policy let through, past its own
// per-address rules; kept across a policy change, past the new ones. So
// a request takes the pool of its agent and policy, and a new policy
// retires the agent's pool, closing its idle connections (one in use
// then goes back to the retired pool, which no request takes again, and
// idles out). P is the policy's type (tproxy's and mitm's: a
// *policy.Policy), compared by identity: a policy is never changed in
// place.
type Pools[P comparable] struct {
	// New makes an agent's pool.
	New func(agent string) *Transports

	mu sync.Mutex
	m  map[string]agentPool[P]
}

type agentPool[P comparable] struct {
	pol P // the policy the pool's connections were dialled under
	ts  *Transports
}

// For is agent's pool under pol.
func (ps *Pools[P]) For(agent string, pol P) *Transports {
	ps.mu.Lock()
	old, ok := ps.m[agent]
	if ok && old.pol == pol {
		ps.mu.Unlock()
		return old.ts
	}
	if ps.m == nil {
		ps.m = map[string]agentPool[P]{}
	}
	ts := ps.New(agent)
	ps.m[agent] = agentPool[P]{pol: pol, ts: ts}
	ps.mu.Unlock()
	if ok {
		old.ts.CloseIdleConnections()
	}
	return ts
}

// Forget drops agent's pool, closing its idle connections.
func (ps *Pools[P]) Forget(agent string) {
	ps.mu.Lock()
	old, ok := ps.m[agent]
	delete(ps.m, agent)
	ps.mu.Unlock()
	if ok {
		old.ts.CloseIdleConnections()
	}
}

// CloseIdleConnections closes every pool's idle connections.
func (ps *Pools[P]) CloseIdleConnections() {
	ps.mu.Lock()
	pools := make([]*Transports, 0, len(ps.m))
	for _, p := range ps.m {
		pools = append(pools, p.ts)
	}
	ps.mu.Unlock()
	for _, ts := range pools {
		ts.CloseIdleConnections()
	}
}
