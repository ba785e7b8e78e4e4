package dnsfilter

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
		assert.Len(t, m.names("a1", a, t0.Add(tt.at)), tt.want, "names after %v", tt.at)
	}
	// Mapped and plain IPv4 are one address.
	assert.Len(t, m.names("a1", netip.MustParseAddr("::ffff:140.82.112.3"), t0), 2, "mapped form")
	// Remembering again refreshes.
	m.remember("a1", a, "short.example", time.Minute, t0.Add(30*time.Minute))
	assert.Empty(t, m.names("a1", a, t0.Add(90*time.Minute)), "refreshed entry outlived its TTL")
	assert.Len(t, m.names("a1", a, t0.Add(30*time.Minute+30*time.Second)), 2, "refresh lost")
	m.forgetAgent("a1")
	assert.Empty(t, m.names("a1", a, t0), "forgotten agent")
}

func TestMemoryBounded(t *testing.T) {
	m := newMemory(time.Hour, time.Hour, 10)
	t0 := time.Unix(1_800_000_000, 0)
	for i := 0; i < 25; i++ {
		m.remember("a1", netip.AddrFrom4([4]byte{140, 82, 0, byte(i)}), fmt.Sprintf("n%d.example", i), time.Hour, t0)
	}
	for i := 0; i < 25; i++ {
		got := m.names("a1", netip.AddrFrom4([4]byte{140, 82, 0, byte(i)}), t0)
		want := i >= 15
		assert.Equal(t, want, len(got) == 1, "address %d: %v (kept=%v)", i, got, want)
	}
	assert.Len(t, m.agents["a1"].byAddr, 10, "addresses held")
	// Many names for one address: at most maxNamesPerAddr.
	a := netip.MustParseAddr("140.82.1.1")
	for i := 0; i < 3*maxNamesPerAddr; i++ {
		m.remember("a2", a, fmt.Sprintf("cdn%d.example", i), time.Duration(i+1)*time.Hour, t0)
	}
	assert.Len(t, m.names("a2", a, t0), maxNamesPerAddr, "names for one address")
}

// TestForgottenAgentsBounded: the trace memory keeps of forgotten agents,
// for queries identified before a Forget, is bounded however many agents
// come and go, and keeps the latest.
func TestForgottenAgentsBounded(t *testing.T) {
	m := newMemory(time.Minute, time.Hour, 16)
	for i := range 3 * maxForgotten {
		m.forgetAgent(fmt.Sprintf("agent-%d", i))
	}
	assert.LessOrEqual(t, len(m.forgotten), maxForgotten)
	last := fmt.Sprintf("agent-%d", 3*maxForgotten-1)
	m.held(last, m.forgets-1)
	assert.NotContains(t, m.agents, last, "a query identified before the latest Forget made its agent's memory again")
}
