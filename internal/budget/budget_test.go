package budget

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRatesTake(t *testing.T) {
	var r Rates
	now := time.Unix(1000, 0)
	taken := 0
	for range 20 {
		if r.Take("a", 1, 5, 10, now) {
			taken++
		}
	}
	assert.Equal(t, 10, taken, "a full bucket gives its burst at once")
	assert.False(t, r.Take("a", 1, 5, 10, now))
	assert.True(t, r.Take("b", 1, 5, 10, now), "another key has its own bucket")
	assert.True(t, r.Take("a", 1, 5, 10, now.Add(200*time.Millisecond)), "one token after 1/5 s")
	assert.False(t, r.Take("a", 1, 5, 10, now.Add(200*time.Millisecond)))
	assert.True(t, r.Take("a", 1, 0, 0, now), "no rate, no limit")
}

func TestRatesBoundKeys(t *testing.T) {
	r := Rates{MaxKeys: 4}
	now := time.Unix(1000, 0)
	for i := range 4 {
		assert.True(t, r.Take(fmt.Sprint(i), 1, 1, 1, now))
	}
	assert.False(t, r.Take("new", 1, 1, 1, now), "every bucket is busy: a new key is shed")
	assert.True(t, r.Take("new", 1, 1, 1, now.Add(2*time.Second)), "idle buckets make room")
	assert.LessOrEqual(t, len(r.buckets), 4)
}

func TestRatesForget(t *testing.T) {
	var r Rates
	now := time.Unix(1000, 0)
	for range 10 {
		require.True(t, r.Take("a", 1, 5, 10, now))
	}
	require.False(t, r.Take("a", 1, 5, 10, now), "the burst is spent")
	r.Wait("b", 3000, 1000, 1000, now) // a debt of two seconds
	r.Forget("a")
	r.Forget("b")
	assert.True(t, r.Take("a", 10, 5, 10, now), "a forgotten key starts full")
	assert.Zero(t, r.Wait("b", 1000, 1000, 1000, now), "and owes nothing")
}

func TestRatesWait(t *testing.T) {
	var r Rates
	now := time.Unix(1000, 0)
	assert.Zero(t, r.Wait("a", 1000, 1000, 1000, now), "the burst is free")
	assert.Equal(t, 500*time.Millisecond, r.Wait("a", 500, 1000, 1000, now), "then 1000 per second")
	assert.Equal(t, time.Second, r.Wait("a", 500, 1000, 1000, now), "debts add up")
	assert.Zero(t, r.Wait("a", 1<<30, 0, 0, now), "no rate, no wait")
}

func TestCounter(t *testing.T) {
	var c Counter
	assert.True(t, c.Acquire("a", 2, 3))
	assert.True(t, c.Acquire("a", 2, 3))
	assert.Equal(t, KeyBound, c.Take("a", 2, 3), "a's limit")
	assert.True(t, c.Acquire("b", 2, 3))
	assert.Equal(t, TotalBound, c.Take("c", 2, 3), "the total")
	assert.Equal(t, KeyBound, c.Take("a", 2, 3), "a's own limit, met first, is named though the total is met too")
	c.Release("a")
	assert.True(t, c.Acquire("c", 2, 3))
	n, total := c.Count("a")
	assert.Equal(t, 1, n)
	assert.Equal(t, 3, total)
	c.Release("a")
	c.Release("b")
	c.Release("c")
	assert.Empty(t, c.n, "released keys are forgotten")
}

// TestCounterKeepsAQuarterForTheLight: keys each within their bound
// cannot together take the last quarter of the total; a key that holds
// few still gets a place.
func TestCounterKeepsAQuarterForTheLight(t *testing.T) {
	var c Counter
	const perKey, total = 32, 64 // past 48 taken, only keys holding fewer than 2
	for range perKey {
		require.True(t, c.Acquire("heavy1", perKey, total))
	}
	taken := perKey
	for c.Acquire("heavy2", perKey, total) {
		taken++
	}
	assert.Equal(t, total-total/4, taken, "heavy2 took places past three quarters")
	for _, light := range []string{"light1", "light2", "light3"} {
		assert.True(t, c.Acquire(light, perKey, total), "%s, holding none, was refused", light)
		assert.True(t, c.Acquire(light, perKey, total), "%s, holding one, was refused", light)
		assert.Equal(t, KeptBound, c.Take(light, perKey, total), "%s took a third place in the kept quarter", light)
	}
	c.Release("heavy1")
	assert.Equal(t, KeptBound, c.Take("heavy1", perKey, total), "a heavy key took a kept place freed")
}

func TestFair(t *testing.T) {
	for _, tc := range []struct {
		held, perKey, taken, total int
		want                       bool
	}{
		{held: 1999, perKey: 2000, taken: 14999, total: 20000, want: true}, // below three quarters
		{held: 1500, perKey: 2000, taken: 15000, total: 20000, want: false},
		{held: 124, perKey: 2000, taken: 19999, total: 20000, want: true}, // light: under a sixteenth
		{held: 125, perKey: 2000, taken: 15000, total: 20000, want: false},
		{held: 0, perKey: 8, taken: 19, total: 20, want: true}, // a sixteenth rounds down: at least one
		{held: 1, perKey: 8, taken: 19, total: 20, want: false},
		{held: 19000, perKey: 20000, taken: 19000, total: 20000, want: true}, // one key may take all
		{held: 1999, perKey: 2000, taken: 1999, total: 2500, want: true},     // alone, a key reaches its bound
		{held: 1500, perKey: 2000, taken: 2000, total: 2500, want: false},    // past the total less perKey
		{held: 124, perKey: 2000, taken: 2499, total: 2500, want: true},
		{held: 100, perKey: 0, taken: 19000, total: 20000, want: true}, // no per-key bound
		{held: 100, perKey: 10, taken: 19000, total: 0, want: true},    // no total
	} {
		assert.Equal(t, tc.want, Fair(tc.held, tc.perKey, tc.taken, tc.total), "%+v", tc)
	}
}

// TestBoundReason: a refusal is named as the key's own bound only when it
// met that bound.
func TestBoundReason(t *testing.T) {
	assert.Empty(t, Within.Reason("own", "shared"))
	assert.Equal(t, "own", KeyBound.Reason("own", "shared"))
	assert.Equal(t, "shared", TotalBound.Reason("own", "shared"))
	assert.Equal(t, "shared", KeptBound.Reason("own", "shared"))
}
