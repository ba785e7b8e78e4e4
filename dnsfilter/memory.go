package dnsfilter

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Defaults for the address memory.
const (
	DefaultMinTTL         = 5 * time.Minute // an answer is remembered at least this long
	DefaultMaxTTL         = time.Hour       // and at most this long
	DefaultMemoryPerAgent = 8192            // remembered (address, name) pairs per agent
	maxNamesPerAddr       = 8
)

// memory remembers, per agent, which names each address was an answer
// for: "the name the agent resolved to that address". Entries live for
// their record's TTL bounded by [minTTL, maxTTL]; each agent keeps at most
// perAgent pairs, evicting the oldest first.
type memory struct {
	minTTL, maxTTL time.Duration
	perAgent       int

	mu        sync.Mutex
	agents    map[string]*agentMemory
	forgets   uint64            // calls of forgetAgent so far
	forgotten map[string]uint64 // forgets at each agent's last, for the last maxForgotten
}

// maxForgotten is how many Forgets memory keeps a trace of, for queries
// identified before one and answered after: far more than are ever in
// flight between the two.
const maxForgotten = 4096

type agentMemory struct {
	byAddr map[netip.Addr][]remembered
	order  []pair // insertion order, oldest first, for eviction
	head   int    // index of the oldest live element of order
}

type remembered struct {
	name    string
	expires time.Time
}

type pair struct {
	addr netip.Addr
	name string
}

func newMemory(minTTL, maxTTL time.Duration, perAgent int) *memory {
	return &memory{minTTL: minTTL, maxTTL: maxTTL, perAgent: perAgent, agents: map[string]*agentMemory{}, forgotten: map[string]uint64{}}
}

// seen is the count of Forgets so far, taken before a query's agent is
// identified, for held.
func (m *memory) seen() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.forgets
}

// held returns agent's memory as it is now (a new one if it has none),
// for a query being answered whose agent was identified after seen
// Forgets: what the answer teaches is remembered there (rememberIn) only
// if Forget has not dropped it meanwhile, so no answer that arrives after
// Forget outlives it. If the agent was forgotten since seen, the memory
// is one no one holds, and the answer is not remembered.
func (m *memory) held(agent string, seen uint64) *agentMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.agents[agent]
	if a == nil {
		a = &agentMemory{byAddr: map[netip.Addr][]remembered{}}
		if f, ok := m.forgotten[agent]; !ok || f <= seen {
			m.agents[agent] = a
		}
	}
	return a
}

// remember records that name resolved to addr for agent, for ttl bounded.
func (m *memory) remember(agent string, addr netip.Addr, name string, ttl time.Duration, now time.Time) {
	m.rememberIn(m.held(agent, m.seen()), agent, addr, name, ttl, now)
}

// rememberIn is remember into held, agent's memory when its query came,
// unless Forget has dropped it since.
func (m *memory) rememberIn(held *agentMemory, agent string, addr netip.Addr, name string, ttl time.Duration, now time.Time) {
	ttl = min(max(ttl, m.minTTL), m.maxTTL)
	addr = addr.Unmap()
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.agents[agent]
	if a != held {
		return
	}
	names := a.byAddr[addr]
	for i := range names {
		if names[i].name == name {
			names[i].expires = now.Add(ttl)
			return
		}
	}
	if len(names) >= maxNamesPerAddr {
		// Replace the entry that expires first.
		i := 0
		for j := range names {
			if names[j].expires.Before(names[i].expires) {
				i = j
			}
		}
		names[i] = remembered{name, now.Add(ttl)}
		return
	}
	a.byAddr[addr] = append(names, remembered{name, now.Add(ttl)})
	a.order = append(a.order, pair{addr, name})
	for len(a.order)-a.head > m.perAgent {
		a.forget(a.order[a.head])
		a.order[a.head] = pair{}
		a.head++
	}
	if a.head > len(a.order)/2 { // compact
		a.order = slices.Clone(a.order[a.head:])
		a.head = 0
	}
}

func (a *agentMemory) forget(p pair) {
	names := a.byAddr[p.addr]
	for i := range names {
		if names[i].name == p.name {
			names = slices.Delete(names, i, i+1)
			break
		}
	}
	if len(names) == 0 {
		delete(a.byAddr, p.addr)
	} else {
		a.byAddr[p.addr] = names
	}
}

// names returns the unexpired names addr was an answer for.
func (m *memory) names(agent string, addr netip.Addr, now time.Time) []string {
	addr = addr.Unmap()
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.agents[agent]
	if a == nil {
		return nil
	}
	var out []string
	for _, r := range a.byAddr[addr] {
		if now.Before(r.expires) {
			out = append(out, r.name)
		}
	}
	return out
}

func (m *memory) forgetAgent(agent string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.agents, agent)
	m.forgets++
	m.forgotten[agent] = m.forgets
	if len(m.forgotten) > maxForgotten {
		maps.DeleteFunc(m.forgotten, func(_ string, f uint64) bool { return f+maxForgotten/2 <= m.forgets })
	}
}
