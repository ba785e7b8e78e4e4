package dnsfilter

import (
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/internal/fairlru"
)

// Cache bounds.
const (
	DefaultCacheSize = 10000
	maxCacheTTL      = time.Hour
	// minCacheTTL is how long an answer is kept at least, whatever its
	// TTL says (zero included): a name whose answers are not to be
	// cached would otherwise go to its zone's name server at every
	// lookup, and the order of lookups among a few such names would
	// carry data there at the agent's query rate.
	minCacheTTL    = 5 * time.Second
	maxNegativeTTL = 5 * time.Minute
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
}

// cache keeps upstream answers for their TTL, up to size entries, each
// the answer of the agent whose query brought it: a full cache makes room
// from the agent that holds the most (fairlru), so that one agent's flood
// of names evicts its own answers, not its neighbours'.
type cache struct {
	mu      sync.Mutex
	entries *fairlru.Cache[cacheKey, cacheEntry]
}

func newCache(size int) *cache {
	return &cache{entries: fairlru.New[cacheKey, cacheEntry](size)}
}

// get returns a cached answer and how long it has been cached.
// has reports whether an answer for k is stored: a lookup of it would
// not go upstream.
func (c *cache) has(k cacheKey, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries.Get(k)
	return ok && now.Before(e.expires)
}

func (c *cache) get(k cacheKey, now time.Time) (*dns.Msg, time.Duration, bool) {
	c.mu.Lock()
	e, ok := c.entries.Get(k)
	if ok && !now.Before(e.expires) {
		c.entries.Delete(k)
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
// bounded (minCacheTTL, maxCacheTTL). Failures are not stored.
func (c *cache) put(owner string, k cacheKey, m *dns.Msg, now time.Time) {
	ttl, ok := cacheTTL(m)
	if !ok {
		return
	}
	ttl = max(ttl, minCacheTTL)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries.Put(owner, k, cacheEntry{msg: m, stored: now, expires: now.Add(ttl)})
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
