package dnsfilter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCacheBookkeeping: under a long mix of stores, stores again, reads
// and expiries by several agents, the cache holds no more than its size
// and never serves an answer past its TTL; a full cache makes room from
// the agent that holds the most.
func TestCacheBookkeeping(t *testing.T) {
	const size = 64
	c := newCache(size)
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Unix(1_000_000, 0)
	answer := func(ttl uint32) *dns.Msg {
		m := new(dns.Msg)
		rr, err := dns.NewRR(fmt.Sprintf("x.test. %d IN A 192.0.2.1", ttl))
		require.NoError(t, err)
		m.Answer = append(m.Answer, rr)
		return m
	}
	owners := []string{"a", "b", "c", ""}
	expires := map[cacheKey]time.Time{}
	for step := range 20000 {
		owner := owners[rng.IntN(len(owners))]
		k := cacheKey{name: fmt.Sprintf("n%d.test.", rng.IntN(200)), qtype: dns.TypeA}
		switch rng.IntN(3) {
		case 0, 1:
			ttl := uint32(1 + rng.IntN(30))
			c.put(owner, k, answer(ttl), now)
			expires[k] = now.Add(max(time.Duration(ttl)*time.Second, minCacheTTL))
		default:
			if _, _, ok := c.get(k, now); ok {
				require.True(t, now.Before(expires[k]), "step %d: an answer served past its TTL", step)
			}
		}
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		require.LessOrEqual(t, c.entries.Len(), size, "step %d", step)
	}

	// Full, one agent holding most: the next stores take from it.
	c = newCache(10)
	for i := range 8 {
		c.put("flood", cacheKey{name: fmt.Sprintf("f%d.", i)}, answer(60), now)
	}
	for i := range 3 {
		c.put("quiet", cacheKey{name: fmt.Sprintf("q%d.", i)}, answer(60), now)
	}
	assert.Equal(t, 10, c.entries.Len())
	for i := range 3 {
		_, _, ok := c.get(cacheKey{name: fmt.Sprintf("q%d.", i)}, now)
		assert.True(t, ok, "the quiet agent's answer q%d went", i)
	}
	_, _, ok := c.get(cacheKey{name: "f0."}, now)
	assert.False(t, ok, "the oldest of the agent holding most stays")
}
