package fairlru

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBookkeeping: under a long mix of stores, stores again, reads and
// deletes by several owners, the cache holds no more than its size,
// every entry is in its owner's list once, and no owner is kept without
// entries.
func TestBookkeeping(t *testing.T) {
	const size = 64
	c := New[string, int](size)
	rng := rand.New(rand.NewPCG(1, 2))
	owners := []string{"a", "b", "c", ""}
	for step := range 20000 {
		owner := owners[rng.IntN(len(owners))]
		k := fmt.Sprintf("n%d", rng.IntN(200))
		switch rng.IntN(4) {
		case 0, 1:
			c.Put(owner, k, step)
		case 2:
			c.Get(k)
		default:
			c.Delete(k)
		}
		require.LessOrEqual(t, c.Len(), size, "step %d", step)
		listed := 0
		for owner, entries := range c.owners {
			require.Positive(t, entries.Len(), "step %d: %q kept without entries", step, owner)
			for el := entries.Front(); el != nil; el = el.Next() {
				e := el.Value.(*entry[string, int])
				require.Equal(t, owner, e.owner, "step %d", step)
				require.Same(t, el, c.byKey[e.key], "step %d: %q listed but not held", step, e.key)
			}
			listed += entries.Len()
		}
		require.Equal(t, c.Len(), listed, "step %d: entries not in their owner's list", step)
	}
}

// TestRoomFromTheOwnerHoldingMost: a full cache makes room from the owner
// that holds the most, its least recently used first; the others keep
// theirs.
func TestRoomFromTheOwnerHoldingMost(t *testing.T) {
	c := New[string, int](10)
	for i := range 8 {
		c.Put("flood", fmt.Sprintf("f%d", i), i)
	}
	_, ok := c.Get("f0") // used again: f1 is the least recently used now
	require.True(t, ok)
	for i := range 3 {
		c.Put("quiet", fmt.Sprintf("q%d", i), i)
	}
	assert.Equal(t, 10, c.Len())
	assert.Equal(t, 7, c.owners["flood"].Len())
	_, ok = c.Get("f1")
	assert.False(t, ok, "the least recently used of the owner holding most stays")
	_, ok = c.Get("f0")
	assert.True(t, ok, "a recently used entry went first")
	for i := range 20 {
		c.Put("flood", fmt.Sprintf("g%d", i), i)
	}
	for i := range 3 {
		_, ok := c.Get(fmt.Sprintf("q%d", i))
		assert.True(t, ok, "q%d was pushed out by the other owner's entries", i)
	}
}
