package dnsfilter

import (
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Cache bounds.
const (
	DefaultCacheSize = 10000
	maxCacheTTL      = time.Hour
	maxNegativeTTL   = 5 * time.Minute
)

// cacheKey identifies an upstream answer. The name is lower case; the
// answer is the same for every agent (filtering is per agent, afterwards).
type cacheKey struct {
	name  string
	qtype uint16
	do    bool // DNSSEC OK: the answer carries signatures
}

type cacheEntry struct {
	msg     *dns.Msg // the upstream answer, never modified
	stored  time.Time
	expires time.Time
	owner   string // the agent whose query brought it ("" for none)
	seq     uint64 // its place in the owner's queue
}

// cache keeps upstream answers for their TTL, up to size entries. Each
// entry belongs to the agent whose query brought it; when the cache is
// full, room is made from the agent that holds the most, its oldest
// first, so that an agent flooding it with names of its own evicts its
// own answers, not its neighbours' (who hold fewer).
type cache struct {
	size int

	mu      sync.Mutex
	entries map[cacheKey]cacheEntry
	owners  map[string]*ownerQueue
	seq     uint64
}

// ownerQueue is an agent's entries, oldest first; some may have gone
// since (expired, or stored again), which the seq tells.
type ownerQueue struct {
	keys []queuedKey
	live int
}

type queuedKey struct {
	key cacheKey
	seq uint64
}

func newCache(size int) *cache {
	return &cache{size: size, entries: make(map[cacheKey]cacheEntry), owners: make(map[string]*ownerQueue)}
}

// get returns a cached answer and how long it has been cached.
func (c *cache) get(k cacheKey, now time.Time) (*dns.Msg, time.Duration, bool) {
	c.mu.Lock()
	e, ok := c.entries[k]
	if ok && !now.Before(e.expires) {
		c.deleteLocked(k, e)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil, 0, false
	}
	return e.msg, now.Sub(e.stored), true
}

// put stores an answer that owner's query brought for its TTL: the
// smallest TTL of its records, or for a negative answer the SOA's,
// bounded. Answers with a zero TTL, and failures, are not stored.
func (c *cache) put(owner string, k cacheKey, m *dns.Msg, now time.Time) {
	ttl, ok := cacheTTL(m)
	if !ok || ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, exists := c.entries[k]; exists {
		c.deleteLocked(k, old)
	}
	if len(c.entries) >= c.size {
		c.evictLocked()
	}
	q := c.owners[owner]
	if q == nil {
		q = &ownerQueue{}
		c.owners[owner] = q
	}
	c.seq++
	q.keys = append(q.keys, queuedKey{key: k, seq: c.seq})
	q.live++
	c.entries[k] = cacheEntry{msg: m, stored: now, expires: now.Add(ttl), owner: owner, seq: c.seq}
}

// deleteLocked removes k's entry e.
func (c *cache) deleteLocked(k cacheKey, e cacheEntry) {
	delete(c.entries, k)
	q := c.owners[e.owner]
	q.live--
	switch {
	case q.live == 0:
		delete(c.owners, e.owner)
	case len(q.keys) > 2*q.live+16:
		// Mostly gone: keep the queue no longer than twice its entries.
		q.keys = slices.DeleteFunc(q.keys, func(qk queuedKey) bool { return !c.holds(e.owner, qk) })
	}
}

// holds says whether qk is still one of owner's entries.
func (c *cache) holds(owner string, qk queuedKey) bool {
	e, ok := c.entries[qk.key]
	return ok && e.owner == owner && e.seq == qk.seq
}

// evictLocked removes the oldest entry of the agent that holds the most.
func (c *cache) evictLocked() {
	var most string
	var q *ownerQueue
	for owner, oq := range c.owners {
		if q == nil || oq.live > q.live {
			most, q = owner, oq
		}
	}
	for q != nil && len(q.keys) > 0 {
		qk := q.keys[0]
		q.keys = q.keys[1:]
		if c.holds(most, qk) {
			c.deleteLocked(qk.key, c.entries[qk.key])
			return
		}
	}
}

func cacheTTL(m *dns.Msg) (time.Duration, bool) {
	switch {
	case m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0:
		ttl := uint32(1<<32 - 1)
		for _, rr := range m.Answer {
			ttl = min(ttl, rr.Header().Ttl)
		}
		return min(time.Duration(ttl)*time.Second, maxCacheTTL), true
	case m.Rcode == dns.RcodeNameError || m.Rcode == dns.RcodeSuccess:
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl := min(soa.Hdr.Ttl, soa.Minttl)
				return min(time.Duration(ttl)*time.Second, maxNegativeTTL), true
			}
		}
	}
	return 0, false
}
