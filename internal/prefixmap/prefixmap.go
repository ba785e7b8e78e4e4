// Package prefixmap maps addresses to the value of the most specific
// prefix that holds them, in logarithmic time: the table behind
// netguard's classification and policy's address entries.
package prefixmap

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// Entry is one prefix and its value, an input to [New].
type Entry[V any] struct {
	Prefix netip.Prefix
	Value  V
}

// Map maps addresses to the value of the most specific prefix that
// contains them. It is built once and read without locks; a lookup is a
// binary search over non-overlapping ranges, so its cost grows with the
// logarithm of the number of prefixes and allocates nothing.
//
// IPv4 prefixes and IPv4-mapped IPv6 prefixes are the same key space:
// ::ffff:10.0.0.0/104 and 10.0.0.0/8 are one prefix. Zones are ignored.
type Map[V any] struct {
	starts []u128    // sorted; starts[i] begins the range that ends before starts[i+1]
	values []slot[V] // the value of each range
}

type slot[V any] struct {
	value V
	ok    bool
}

// New builds a map from entries. Where one prefix lies inside
// another (or equals it), the inner prefix's value is merge(outer, inner);
// for equal prefixes, the one given first is the outer. A nil merge means the
// inner value wins. Invalid prefixes are skipped; callers validate first.
func New[V any](entries []Entry[V], merge func(outer, inner V) V) *Map[V] {
	if merge == nil {
		merge = func(_, inner V) V { return inner }
	}
	type span struct {
		start, end u128
		bits       int
		value      V
	}
	spans := make([]span, 0, len(entries))
	for _, e := range entries {
		p, ok := canonicalPrefix(e.Prefix)
		if !ok {
			continue
		}
		bits := p.Bits()
		if p.Addr().Is4() {
			bits += 96 // the key space is IPv6; IPv4 lives in ::ffff:0:0/96
		}
		start := keyOf(p.Addr())
		spans = append(spans, span{start, start.or(hostMask(bits)), bits, e.Value})
	}
	slices.SortStableFunc(spans, func(a, b span) int {
		if c := a.start.cmp(b.start); c != 0 {
			return c
		}
		return a.bits - b.bits
	})

	m := &Map[V]{}
	emit := func(start u128, s slot[V]) {
		if n := len(m.starts); n > 0 && m.starts[n-1] == start {
			m.values[n-1] = s
			return
		}
		m.starts = append(m.starts, start)
		m.values = append(m.values, s)
	}
	var stack []span // enclosing spans, outermost first
	// pop closes the innermost open span; the range after it reverts to
	// its parent's value, or to no value.
	pop := func() {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if top.end == maxU128 {
			return
		}
		var next slot[V]
		if n := len(stack); n > 0 {
			next = slot[V]{stack[n-1].value, true}
		}
		emit(top.end.inc(), next)
	}
	for _, s := range spans {
		for len(stack) > 0 && stack[len(stack)-1].end.less(s.start) {
			pop()
		}
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			if top.start == s.start && top.bits == s.bits {
				top.value = merge(top.value, s.value)
				emit(s.start, slot[V]{top.value, true})
				continue
			}
			s.value = merge(top.value, s.value)
		}
		stack = append(stack, s)
		emit(s.start, slot[V]{s.value, true})
	}
	for len(stack) > 0 {
		pop()
	}
	return m
}

// Lookup returns the value of the most specific prefix containing a.
func (m *Map[V]) Lookup(a netip.Addr) (V, bool) {
	var zero V
	if m == nil || !a.IsValid() {
		return zero, false
	}
	k := keyOf(a)
	// Find the last start <= k.
	lo, hi := 0, len(m.starts)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if k.less(m.starts[mid]) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == 0 {
		return zero, false
	}
	s := m.values[lo-1]
	return s.value, s.ok
}

// Len reports the number of ranges the map holds (at most twice the number
// of prefixes plus one), a measure of its memory.
func (m *Map[V]) Len() int {
	if m == nil {
		return 0
	}
	return len(m.starts)
}

// canonicalPrefix masks p and turns IPv4-mapped IPv6 prefixes of /96 or
// longer into IPv4 prefixes.
func canonicalPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	a := p.Addr().WithZone("")
	bits := p.Bits()
	if a.Is4In6() && bits >= 96 {
		a, bits = a.Unmap(), bits-96
	}
	return netip.PrefixFrom(a, bits).Masked(), true
}

// u128 is an address as a 128-bit integer, IPv4 in its mapped form.
type u128 struct{ hi, lo uint64 }

var maxU128 = u128{^uint64(0), ^uint64(0)}

func keyOf(a netip.Addr) u128 {
	b := a.Unmap().As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// hostMask returns the host part of a 128-bit prefix of the given length.
func hostMask(bits int) u128 {
	switch {
	case bits <= 0:
		return maxU128
	case bits < 64:
		return u128{^uint64(0) >> bits, ^uint64(0)}
	case bits < 128:
		return u128{0, ^uint64(0) >> (bits - 64)}
	default:
		return u128{}
	}
}

func (a u128) or(b u128) u128 { return u128{a.hi | b.hi, a.lo | b.lo} }

func (a u128) less(b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }

func (a u128) cmp(b u128) int {
	switch {
	case a.less(b):
		return -1
	case b.less(a):
		return 1
	}
	return 0
}

func (a u128) inc() u128 {
	lo := a.lo + 1
	hi := a.hi
	if lo == 0 {
		hi++
	}
	return u128{hi, lo}
}
