// Package budget bounds what each agent may take of a shared gateway: a
// rate per agent (token buckets) and a count of things in progress per
// agent, each with a total as well, so that one agent's load is shed
// before it reaches anyone else's share. Keys are agents; a key's state is
// made on first use and dropped once it is idle, and the number of keys
// is bounded, so a flood of new keys costs bounded memory.
package budget

import (
	"sync"
	"time"
)

// DefaultMaxKeys bounds the keys a Rates or a Counter tracks at once.
const DefaultMaxKeys = 65536

// Rates is a token bucket per key. The zero Rates is ready to use.
type Rates struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	MaxKeys int // zero means DefaultMaxKeys
}

type bucket struct {
	tokens float64
	last   time.Time
}

// Take takes n tokens from key's bucket, which fills at rate per second up
// to burst, and reports whether they were there. A rate of zero or less
// means no limit. When the map is full, idle buckets (full again) are
// dropped; if none is, the taker is refused: a flood of keys is shed, not
// remembered.
func (r *Rates) Take(key string, n, rate, burst float64, now time.Time) bool {
	if rate <= 0 {
		return true
	}
	burst = max(burst, n, rate)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buckets == nil {
		r.buckets = map[string]*bucket{}
	}
	b := r.buckets[key]
	if b == nil {
		if len(r.buckets) >= orMax(r.MaxKeys) && !r.dropIdle(rate, burst, now) {
			return false
		}
		b = &bucket{tokens: burst, last: now}
		r.buckets[key] = b
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	b.last = now
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// Wait returns how long to wait before n tokens are there, having taken
// them (the bucket may go negative: a debt the next takers wait off). For
// bytes: the caller sleeps the returned time after moving n bytes.
func (r *Rates) Wait(key string, n, rate, burst float64, now time.Time) time.Duration {
	if rate <= 0 {
		return 0
	}
	burst = max(burst, rate)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buckets == nil {
		r.buckets = map[string]*bucket{}
	}
	b := r.buckets[key]
	if b == nil {
		if len(r.buckets) >= orMax(r.MaxKeys) {
			r.dropIdle(rate, burst, now)
		}
		b = &bucket{tokens: burst, last: now}
		r.buckets[key] = b
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	b.last = now
	b.tokens -= n
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / rate * float64(time.Second))
}

// Forget drops key's bucket: the key starts full again, as a new one
// does. For an agent removed, whose name may be given to another.
func (r *Rates) Forget(key string) {
	r.mu.Lock()
	delete(r.buckets, key)
	r.mu.Unlock()
}

// dropIdle drops the buckets that are full again; it reports whether any
// was.
func (r *Rates) dropIdle(rate, burst float64, now time.Time) bool {
	dropped := false
	for k, b := range r.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*rate >= burst {
			delete(r.buckets, k)
			dropped = true
		}
	}
	return dropped
}

func orMax(n int) int {
	if n > 0 {
		return n
	}
	return DefaultMaxKeys
}

// Counter counts things in progress per key, with a limit per key and a
// limit in total. The zero Counter is ready to use.
type Counter struct {
	mu    sync.Mutex
	n     map[string]int
	total int
}

// Bound names the limit a Counter's Take met, or Within when it met none.
type Bound int

const (
	Within     Bound = iota // counted in
	KeyBound                // the key holds perKey already
	TotalBound              // the total holds total already
	KeptBound               // the place is one Fair keeps for keys that hold few
)

// Reason is the reason of a refusal for b: own for the key's own bound,
// shared for the total's or the part Fair keeps; "" for Within.
func (b Bound) Reason(own, shared string) string {
	switch b {
	case Within:
		return ""
	case KeyBound:
		return own
	default:
		return shared
	}
}

// Acquire counts one in for key unless key already has perKey or the
// total has total (a limit of zero or less means none), or the place is
// one Fair keeps for keys that hold few, and reports whether it did;
// Release counts it out.
func (c *Counter) Acquire(key string, perKey, total int) bool {
	return c.Take(key, perKey, total) == Within
}

// Take is Acquire that names the limit it met, judged under the one lock
// that counts: a refusal is told apart as the key's own or the gateway's
// without a second look at counts that may have moved since.
func (c *Counter) Take(key string, perKey, total int) Bound {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	held := c.n[key]
	switch {
	case perKey > 0 && held >= perKey:
		return KeyBound
	case total > 0 && c.total >= total:
		return TotalBound
	case !Fair(held, perKey, c.total, total):
		return KeptBound
	}
	c.n[key]++
	c.total++
	return Within
}

// Fair reports whether a key that holds held places may take one more
// of a total shared by keys each bounded by perKey, while taken are
// taken. Until three quarters of the total are taken, it may; past
// them, only a key that holds fewer than a sixteenth of perKey (at least
// one) may, so that keys each within their bound cannot together take
// every place from one that holds few: ten agents at the default
// 2,000 connections each would otherwise hold all 20,000 of a gateway's.
// The part kept is never more than the total less perKey, so that a key
// alone always reaches its own bound; with no per-key bound, or one that
// lets a key take the whole total (a gateway for one agent), none is.
func Fair(held, perKey, taken, total int) bool {
	if perKey <= 0 || total <= 0 || perKey >= total {
		return true
	}
	if kept := min(total/4, total-perKey); taken < total-kept {
		return true
	}
	return held < max(perKey/16, 1)
}

// Release counts one out for key.
func (c *Counter) Release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] <= 1 {
		delete(c.n, key)
	} else {
		c.n[key]--
	}
	c.total--
}

// Count returns key's count and the total.
func (c *Counter) Count(key string) (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key], c.total
}
