package prefixmap

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// naiveLookup is the obvious longest-prefix match that Map must agree
// with, merging values from the outermost prefix inwards.
func naiveLookup(entries []Entry[int], merge func(outer, inner int) int, a netip.Addr) (int, bool) {
	a = a.Unmap()
	var chain []Entry[int]
	for _, e := range entries {
		p, _ := canonicalPrefix(e.Prefix)
		if p.Contains(a) {
			chain = append(chain, Entry[int]{p, e.Value})
		}
	}
	if len(chain) == 0 {
		return 0, false
	}
	// Stable order from outermost to innermost.
	for i := 1; i < len(chain); i++ {
		for j := i; j > 0 && chain[j].Prefix.Bits() < chain[j-1].Prefix.Bits(); j-- {
			chain[j], chain[j-1] = chain[j-1], chain[j]
		}
	}
	v := chain[0].Value
	for _, e := range chain[1:] {
		v = merge(v, e.Value)
	}
	return v, true
}

func TestPrefixMapMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	randPrefix := func() netip.Prefix {
		if r.IntN(2) == 0 {
			// Cluster IPv4 prefixes so that many nest.
			b := [4]byte{byte(10 + r.IntN(3)), byte(r.IntN(4)), byte(r.IntN(256)), byte(r.IntN(256))}
			return netip.PrefixFrom(netip.AddrFrom4(b), r.IntN(33)).Masked()
		}
		var b [16]byte
		b[0], b[1], b[2] = 0x20, 0x01, byte(r.IntN(4))
		for i := 3; i < 16; i++ {
			b[i] = byte(r.IntN(256))
		}
		return netip.PrefixFrom(netip.AddrFrom16(b), 8+r.IntN(121)).Masked()
	}
	merges := map[string]func(outer, inner int) int{
		"inner wins": func(_, inner int) int { return inner },
		"sum":        func(outer, inner int) int { return outer + inner },
	}
	for name, merge := range merges {
		t.Run(name, func(t *testing.T) {
			for round := 0; round < 50; round++ {
				var entries []Entry[int]
				for i := 0; i < 1+r.IntN(40); i++ {
					p := randPrefix()
					entries = append(entries, Entry[int]{p, i + 1})
					if r.IntN(5) == 0 { // duplicates
						entries = append(entries, Entry[int]{p, 100 + i})
					}
				}
				m := New(entries, merge)
				probe := func(a netip.Addr) {
					got, gok := m.Lookup(a)
					want, wok := naiveLookup(entries, merge, a)
					require.Equal(t, want, got, "round %d: Lookup(%v) value", round, a)
					require.Equal(t, wok, gok, "round %d: Lookup(%v) found", round, a)
				}
				for _, e := range entries {
					p, _ := canonicalPrefix(e.Prefix)
					probe(p.Addr())
					probe(lastAddr(p))
					if n := lastAddr(p).Next(); n.IsValid() {
						probe(n)
					}
					if prev := p.Addr().Prev(); prev.IsValid() {
						probe(prev)
					}
				}
				for i := 0; i < 200; i++ {
					probe(randPrefix().Addr())
				}
			}
		})
	}
}

func TestPrefixMapEdges(t *testing.T) {
	m := New([]Entry[string]{
		{netip.MustParsePrefix("::/0"), "all6"},
		{netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"), "max"},
		{netip.MustParsePrefix("::/128"), "min"},
		{netip.MustParsePrefix("255.255.255.255/32"), "bcast"},
		{netip.MustParsePrefix("::ffff:10.0.0.0/104"), "ten"},
		{netip.Prefix{}, "ignored"},
	}, nil)
	tests := []struct{ addr, want string }{
		{"::", "min"}, {"::1", "all6"}, {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "max"},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "all6"}, {"255.255.255.255", "bcast"},
		{"255.255.255.254", "all6"}, {"10.1.2.3", "ten"}, {"::ffff:10.1.2.3", "ten"}, {"11.0.0.0", "all6"},
	}
	for _, tt := range tests {
		got, ok := m.Lookup(netip.MustParseAddr(tt.addr))
		assert.True(t, ok, "Lookup(%s) found nothing", tt.addr)
		assert.Equal(t, tt.want, got, "Lookup(%s)", tt.addr)
	}
	var empty *Map[int]
	_, ok := empty.Lookup(netip.MustParseAddr("1.1.1.1"))
	assert.False(t, ok, "nil map found a value")
	_, ok = m.Lookup(netip.Addr{})
	assert.False(t, ok, "invalid address found a value")
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
