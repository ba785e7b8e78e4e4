// Package fairlru is a bounded cache whose entries belong to owners (the
// agents whose work brought them): when it is full, room is made from
// the owner that holds the most, its least recently used entry first, so
// that one owner filling it with keys of its own pushes out its own
// entries, not its neighbours', who hold fewer. dnsfilter's answer cache
// and mitm's leaf cache are two.
package fairlru

import "container/list"

// Cache holds up to its size entries; make one with New. It is not safe
// for concurrent use: its user holds the lock.
type Cache[K comparable, V any] struct {
	size   int
	byKey  map[K]*list.Element
	owners map[string]*list.List // each owner's entries, most recent first
}

type entry[K comparable, V any] struct {
	key   K
	owner string
	value V
}

// New returns a cache of up to size entries (at least one).
func New[K comparable, V any](size int) *Cache[K, V] {
	return &Cache[K, V]{size: max(size, 1), byKey: map[K]*list.Element{}, owners: map[string]*list.List{}}
}

// Get returns k's value, its entry now the most recently used of its
// owner's.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	el, ok := c.byKey[k]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*entry[K, V])
	c.owners[e.owner].MoveToFront(el)
	return e.value, true
}

// Put stores v for k as owner's, in place of what k held, making room
// from the owner that holds the most if the cache is full.
func (c *Cache[K, V]) Put(owner string, k K, v V) {
	c.Delete(k)
	for len(c.byKey) >= c.size {
		c.evict()
	}
	entries := c.owners[owner]
	if entries == nil {
		entries = list.New()
		c.owners[owner] = entries
	}
	c.byKey[k] = entries.PushFront(&entry[K, V]{key: k, owner: owner, value: v})
}

// Delete drops k's entry, if there is one.
func (c *Cache[K, V]) Delete(k K) {
	el, ok := c.byKey[k]
	if !ok {
		return
	}
	e := el.Value.(*entry[K, V])
	entries := c.owners[e.owner]
	entries.Remove(el)
	if entries.Len() == 0 {
		delete(c.owners, e.owner)
	}
	delete(c.byKey, k)
}

// Len is how many entries the cache holds.
func (c *Cache[K, V]) Len() int { return len(c.byKey) }

// evict drops the least recently used entry of the owner that holds the
// most.
func (c *Cache[K, V]) evict() {
	var most *list.List
	for _, entries := range c.owners {
		if most == nil || entries.Len() > most.Len() {
			most = entries
		}
	}
	c.Delete(most.Back().Value.(*entry[K, V]).key)
}
