//go:build linux

package nftrules

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/testkit"
)

// conntrackWorld is a gateway namespace with two agents on links of
// their own, the gateway rules with the given ceiling on new
// connections, and a proxy that accepts each connection and closes it.
type conntrackWorld struct {
	gw     *netns.NS
	agents [2]*netns.NS
}

func newConntrackWorld(t *testing.T, connsPerSecond uint32) *conntrackWorld {
	testkit.RequireNamespaces(t)
	if _, err := exec.LookPath("conntrack"); err != nil {
		t.Skip("requires the conntrack command (make deps)")
	}
	w := &conntrackWorld{gw: testkit.NewNS(t, "ct-gw")}
	var links []Link
	for i := range w.agents {
		a := testkit.NewNS(t, fmt.Sprintf("ct-ag%d", i))
		iface := fmt.Sprintf("agent%d", i)
		require.NoError(t, netns.Veth(w.gw, iface, a, "eth0"))
		gw4, sb4 := fmt.Sprintf("198.18.%d.1", 72+i), fmt.Sprintf("198.18.%d.10", 72+i)
		require.NoError(t, w.gw.IP("addr", "add", gw4+"/24", "dev", iface))
		require.NoError(t, a.IPBatch(
			[]string{"link", "set", "lo", "up"},
			[]string{"addr", "add", sb4 + "/24", "dev", "eth0"},
			[]string{"route", "add", "default", "via", gw4},
		))
		links = append(links, Link{Interface: iface, Addrs: []netip.Addr{netip.MustParseAddr(sb4)}})
		w.agents[i] = a
	}
	r, err := GatewayRules{Table: netns.Unique("egress_ct"), NetNS: w.gw.Path(), DNSPort: 15053, ProxyPort: 15001,
		Links: links, AgentPools: []netip.Prefix{netip.MustParsePrefix("198.18.72.0/23")}, NewConnectionsPerSecond: connsPerSecond}.Apply()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	var ln net.Listener
	require.NoError(t, w.gw.Do(func() (err error) { ln, err = net.Listen("tcp", ":15001"); return err }))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return w
}

// entries is how many live flows the gateway's connection tracking
// table holds. (Its nf_conntrack_count counts expired entries too, until
// the kernel's collector gets to them; a full table reclaims those on
// demand.)
func (w *conntrackWorld) entries(t *testing.T) int {
	cmd := w.gw.Command(context.Background(), "conntrack", "-L")
	out, err := cmd.Output()
	require.NoError(t, err)
	return strings.Count(string(out), "\n")
}

// connect opens and closes connections from agent i, from four
// goroutines, until n have been tried or d has passed, and returns how
// many were accepted and how long it took.
func (w *conntrackWorld) connect(i, n int, d time.Duration) (accepted int, took time.Duration) {
	var ok, tried atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for range 4 {
		wg.Go(func() {
			w.agents[i].Do(func() error {
				for tried.Add(1) <= int64(n) && time.Now().Before(end) {
					// Any address: every TCP connection goes to the proxy.
					c, err := net.DialTimeout("tcp", "198.18.99.1:443", 250*time.Millisecond)
					if err == nil {
						ok.Add(1)
						c.Close()
					}
				}
				return nil
			})
		})
	}
	wg.Wait()
	return int(ok.Load()), time.Since(start)
}

// TestClosedAgentFlowsLeaveTheTableSoon: an agent that opens and closes
// connections as fast as it can leaves each in the gateway's connection
// tracking table (which every agent's flows share, and whose being full
// drops every agent's new ones) for 10 s after it closed, not the
// kernel's 120 s.
func TestClosedAgentFlowsLeaveTheTableSoon(t *testing.T) {
	w := newConntrackWorld(t, 0)
	accepted, _ := w.connect(0, 1000, 10*time.Second)
	require.Equal(t, 1000, accepted)
	require.GreaterOrEqual(t, w.entries(t), 900, "the closed connections are in the table")
	var left int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if left = w.entries(t); left < 50 {
			break
		}
	}
	assert.Less(t, left, 50, "closed connections still tracked after 20 s; the kernel's default keeps them 120 s")
}

// TestAgentConnectionFloodHasACeiling: an agent's new connections beyond
// its interface's ceiling are dropped in the kernel, before they take a
// place in the table, and another agent, under its own ceiling, connects
// all the while.
func TestAgentConnectionFloodHasACeiling(t *testing.T) {
	const ceiling = 100
	w := newConntrackWorld(t, ceiling)
	var flooded int
	var took time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		flooded, took = w.connect(0, 20000, 2*time.Second)
	}()
	time.Sleep(200 * time.Millisecond) // the flood under way
	neighbour, _ := w.connect(1, 40, 5*time.Second)
	<-done
	assert.Equal(t, 40, neighbour, "the neighbour's connections were refused during the flood")
	most := 2*ceiling + int(float64(ceiling)*took.Seconds()) + 20
	assert.LessOrEqual(t, flooded, most, "the flooding agent's connections in %v: over its ceiling of %d a second", took, ceiling)
	assert.Positive(t, flooded, "the flooding agent connects within its ceiling")
}
