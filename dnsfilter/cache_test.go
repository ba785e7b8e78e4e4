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
// and expiries by several agents, the cache holds no more than its size,
// each agent's count is its entries, its queue stays within twice its
// entries, and a full cache makes room from the agent that holds the most.
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
	for step := range 20000 {
		owner := owners[rng.IntN(len(owners))]
		k := cacheKey{name: fmt.Sprintf("n%d.test.", rng.IntN(200)), qtype: dns.TypeA}
		switch rng.IntN(3) {
		case 0, 1:
			c.put(owner, k, answer(uint32(1+rng.IntN(30))), now)
		default:
			c.get(k, now)
		}
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)

		require.LessOrEqual(t, len(c.entries), size, "step %d", step)
		live := map[string]int{}
		for _, e := range c.entries {
			live[e.owner]++
		}
		for owner, q := range c.owners {
			require.Equal(t, live[owner], q.live, "step %d: %q's count", step, owner)
			require.LessOrEqual(t, len(q.keys), 2*q.live+17, "step %d: %q's queue", step, owner)
		}
		require.Len(t, c.owners, len(live), "step %d: owners without entries", step)
	}

	// Full, one agent holding most: the next store takes from it.
	c = newCache(10)
	for i := range 8 {
		c.put("flood", cacheKey{name: fmt.Sprintf("f%d.", i)}, answer(60), now)
	}
	c.put("quiet", cacheKey{name: "q0."}, answer(60), now)
	c.put("quiet", cacheKey{name: "q1."}, answer(60), now)
	c.put("quiet", cacheKey{name: "q2."}, answer(60), now)
	assert.Equal(t, 7, c.owners["flood"].live)
	assert.Equal(t, 3, c.owners["quiet"].live)
	_, _, ok := c.get(cacheKey{name: "f0."}, now)
	assert.False(t, ok, "the oldest of the agent holding most stays")
}
