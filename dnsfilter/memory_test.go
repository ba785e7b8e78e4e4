package dnsfilter

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func TestMemoryTTLBounds(t *testing.T) {
	m := newMemory(time.Minute, time.Hour, 100)
	t0 := time.Unix(1_800_000_000, 0)
	a := netip.MustParseAddr("140.82.112.3")
	m.remember("a1", a, "short.example", time.Second, t0) // raised to a minute
	m.remember("a1", a, "long.example", 48*time.Hour, t0) // lowered to an hour
	tests := []struct {
		at   time.Duration
		want int
	}{
		{0, 2}, {59 * time.Second, 2}, {time.Minute, 1}, {59 * time.Minute, 1}, {time.Hour, 0},
	}
	for _, tt := range tests {
		if got := m.names("a1", a, t0.Add(tt.at)); len(got) != tt.want {
			t.Errorf("after %v: %v, want %d names", tt.at, got, tt.want)
		}
	}
	// Mapped and plain IPv4 are one address.
	if got := m.names("a1", netip.MustParseAddr("::ffff:140.82.112.3"), t0); len(got) != 2 {
		t.Errorf("mapped form: %v", got)
	}
	// Remembering again refreshes.
	m.remember("a1", a, "short.example", time.Minute, t0.Add(30*time.Minute))
	if got := m.names("a1", a, t0.Add(90*time.Minute)); len(got) != 0 {
		t.Errorf("refreshed entry outlived its TTL: %v", got)
	}
	if got := m.names("a1", a, t0.Add(30*time.Minute+30*time.Second)); len(got) != 2 {
		t.Errorf("refresh lost: %v", got)
	}
	m.forgetAgent("a1")
	if got := m.names("a1", a, t0); len(got) != 0 {
		t.Errorf("forgotten agent: %v", got)
	}
}

func TestMemoryBounded(t *testing.T) {
	m := newMemory(time.Hour, time.Hour, 10)
	t0 := time.Unix(1_800_000_000, 0)
	for i := 0; i < 25; i++ {
		m.remember("a1", netip.AddrFrom4([4]byte{140, 82, 0, byte(i)}), fmt.Sprintf("n%d.example", i), time.Hour, t0)
	}
	for i := 0; i < 25; i++ {
		got := m.names("a1", netip.AddrFrom4([4]byte{140, 82, 0, byte(i)}), t0)
		if want := i >= 15; (len(got) == 1) != want {
			t.Errorf("address %d: %v (kept=%v)", i, got, want)
		}
	}
	if n := len(m.agents["a1"].byAddr); n != 10 {
		t.Errorf("%d addresses held, want 10", n)
	}
	// Many names for one address: at most maxNamesPerAddr.
	a := netip.MustParseAddr("140.82.1.1")
	for i := 0; i < 3*maxNamesPerAddr; i++ {
		m.remember("a2", a, fmt.Sprintf("cdn%d.example", i), time.Duration(i+1)*time.Hour, t0)
	}
	if got := m.names("a2", a, t0); len(got) != maxNamesPerAddr {
		t.Errorf("%d names for one address, want %d", len(got), maxNamesPerAddr)
	}
}
