package httpfwd

import (
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Pools keeps each agent's own upstream connections, for the policy they
// were dialled under. A dial checks each address against the policy of
// the request it is for (Config.Check), and a kept-alive connection is
// not dialled again: shared between agents, one agent's request would
// ride a connection another's policy let through, past its own
// per-address rules; kept across a policy change, past the new ones. So
// a request takes the pool of its agent and policy, and a new policy
// retires the agent's pool, closing its idle connections. A connection
// in use then goes back to the retired pool, which no request takes
// again: it is kept with the agent's pool until the connections it
// dialled are closed and no request that took it is still on its way to
// dial, so that CloseIdle and Forget reach them. A forgotten agent's
// pools are kept so too, for its requests still under way, until the
// agent comes back under another policy or they hold no connection.
// While any such pool is kept, a sweep closes its idle connections every
// sweepEvery: one in use when its pool was retired goes idle later
// (HTTP/2's when its last stream ends, HTTP/1's after a request that
// took the pool before it was retired has dialled), and would otherwise
// stay open, under the old policy, for the transport's idle timeout.
// P is the policy's type (tproxy's and mitm's: a *policy.Policy),
// compared by identity: a policy is never changed in place.
type Pools[P comparable] struct {
	// New makes an agent's pool.
	New func(agent string) *Transports

	mu        sync.Mutex
	m         map[string]*agentPool[P]
	forgotten map[string]struct{} // agents of m that Forget dropped
	sweeping  bool                // a sweep is due
}

// sweepEvery is how often the pools no request takes again are swept of
// their idle connections.
const sweepEvery = time.Second

type agentPool[P comparable] struct {
	pol     P // the policy the pool's connections were dialled under
	ts      *Transports
	retired []*Transports // earlier policies' pools with connections open
}

// all is the pool and the retired ones.
func (ap *agentPool[P]) all() []*Transports {
	return append(slices.Clip(ap.retired), ap.ts)
}

// prune drops the retired pools that no request uses and whose
// connections are all closed.
func (ap *agentPool[P]) prune() {
	ap.retired = slices.DeleteFunc(ap.retired, (*Transports).unused)
}

// RoundTrip sends r on agent's pool under pol, on its transport for
// allowPrivate.
func (ps *Pools[P]) RoundTrip(agent string, pol P, allowPrivate bool, r *http.Request) (*http.Response, error) {
	ts := ps.take(agent, pol)
	defer ts.users.Add(-1) // whatever it dialled is open, and counted, by now
	return ts.For(allowPrivate).RoundTrip(r)
}

// take is agent's pool under pol, counted as used until the caller is
// done with it, so that no prune drops it before its request has dialled.
func (ps *Pools[P]) take(agent string, pol P) *Transports {
	ps.mu.Lock()
	ap, ok := ps.m[agent]
	if ok && ap.pol == pol {
		ap.ts.users.Add(1)
		ps.mu.Unlock()
		return ap.ts
	}
	if ps.m == nil {
		ps.m, ps.forgotten = map[string]*agentPool[P]{}, map[string]struct{}{}
	}
	ts := ps.New(agent)
	ts.users.Add(1)
	if !ok {
		ps.m[agent] = &agentPool[P]{pol: pol, ts: ts}
		ps.mu.Unlock()
		return ts
	}
	delete(ps.forgotten, agent) // the agent is back, under a policy of its own
	old := ap.ts
	ap.prune()
	ap.pol, ap.ts, ap.retired = pol, ts, append(ap.retired, old)
	ps.sweepLater()
	ps.mu.Unlock()
	old.CloseIdleConnections()
	return ts
}

// CloseIdle closes the idle connections of agent's pool and of its
// retired ones: those an agent at a bound of upstream connections holds
// and no request uses.
func (ps *Pools[P]) CloseIdle(agent string) {
	ps.closeIdle([]string{agent})
}

// Forget drops agent's pools: their idle connections are closed, and
// those in use when their requests end (or at the next Forget).
func (ps *Pools[P]) Forget(agent string) {
	ps.mu.Lock()
	if _, ok := ps.m[agent]; ok {
		ps.forgotten[agent] = struct{}{}
		ps.sweepLater()
	}
	agents := slices.Collect(maps.Keys(ps.forgotten))
	ps.mu.Unlock()
	ps.closeIdle(agents)
}

// closeIdle closes the idle connections of agents' pools, prunes their
// retired pools, and drops those of forgotten agents that hold none.
func (ps *Pools[P]) closeIdle(agents []string) {
	ps.mu.Lock()
	var pools []*Transports
	for _, agent := range agents {
		if ap, ok := ps.m[agent]; ok {
			pools = append(pools, ap.all()...)
		}
	}
	ps.mu.Unlock()
	ps.closeIdleOf(pools, agents)
}

// closeIdleOf closes pools' idle connections, then prunes agents'
// retired pools, and drops those of forgotten agents that hold none.
func (ps *Pools[P]) closeIdleOf(pools []*Transports, agents []string) {
	for _, ts := range pools {
		ts.CloseIdleConnections()
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, agent := range agents {
		ap, ok := ps.m[agent]
		if !ok {
			continue
		}
		ap.prune()
		if ps.isForgotten(agent) && ap.ts.unused() && len(ap.retired) == 0 {
			delete(ps.m, agent)
			delete(ps.forgotten, agent)
		}
	}
}

// sweepLater has sweep run after sweepEvery, unless it is due already.
// ps.mu is held.
func (ps *Pools[P]) sweepLater() {
	if !ps.sweeping {
		ps.sweeping = true
		time.AfterFunc(sweepEvery, ps.sweep)
	}
}

// sweep closes the idle connections of the pools no request takes again
// (retired ones, and all of a forgotten agent's), drops those left with
// none, and comes again while any is kept. A live agent's own pool keeps
// its idle connections.
func (ps *Pools[P]) sweep() {
	ps.mu.Lock()
	ps.sweeping = false
	var pools []*Transports
	var agents []string
	for agent, ap := range ps.m {
		if ps.isForgotten(agent) {
			pools = append(pools, ap.all()...)
		} else if len(ap.retired) > 0 {
			pools = append(pools, ap.retired...)
		} else {
			continue
		}
		agents = append(agents, agent)
	}
	ps.mu.Unlock()
	ps.closeIdleOf(pools, agents)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, agent := range agents {
		if ap, ok := ps.m[agent]; ok && (len(ap.retired) > 0 || ps.isForgotten(agent)) {
			ps.sweepLater()
			return
		}
	}
}

// isForgotten says whether Forget dropped agent. ps.mu is held.
func (ps *Pools[P]) isForgotten(agent string) bool {
	_, gone := ps.forgotten[agent]
	return gone
}

// CloseIdleConnections closes every pool's idle connections.
func (ps *Pools[P]) CloseIdleConnections() {
	ps.mu.Lock()
	agents := slices.Collect(maps.Keys(ps.m))
	ps.mu.Unlock()
	ps.closeIdle(agents)
}
