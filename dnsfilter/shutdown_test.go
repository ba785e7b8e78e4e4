package dnsfilter

import (
	"context"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// TestShutdownWhileServing starts and stops servers in quick succession
// while clients query them, so that Shutdown lands at every point of
// Serve's start: each Serve must return ErrServerClosed, and no server may
// go on serving (the package's leak check would see it).
func TestShutdownWhileServing(t *testing.T) {
	up := startUpstream(t)
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"example.com"}})
	require.NoError(t, err)
	agents := func(netip.Addr) (string, *policy.Policy, bool) { return "a1", pol, true }

	const cycles = 100
	for i := range cycles {
		srv := &Server{Agents: agents, Upstreams: []string{up.addr}, Timeout: 200 * time.Millisecond}
		pc, ln := testkit.ListenDNS(t)
		addr := pc.LocalAddr().String()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(pc, ln) }()

		var clients sync.WaitGroup
		for _, network := range []string{"udp", "tcp"} {
			clients.Add(1)
			go func() {
				defer clients.Done()
				c := &dns.Client{Net: network, Timeout: 100 * time.Millisecond}
				m := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
				c.Exchange(m, addr) // any outcome: the server is being stopped
			}()
		}
		for range i % 8 {
			runtime.Gosched() // land at a different point of the start each cycle
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		assert.NoError(t, srv.Shutdown(ctx), "cycle %d", i)
		cancel()
		select {
		case err := <-served:
			assert.ErrorIs(t, err, ErrServerClosed, "cycle %d", i)
		case <-time.After(5 * time.Second):
			t.Fatalf("cycle %d: Serve still running 5s after Shutdown returned", i)
		}
		clients.Wait()
	}
}

// TestServeAfterShutdown refuses to start and closes what it was given.
func TestServeAfterShutdown(t *testing.T) {
	srv := &Server{}
	require.NoError(t, srv.Close())
	pc, ln := testkit.ListenDNS(t)
	assert.ErrorIs(t, srv.Serve(pc, ln), ErrServerClosed)
	_, _, err := pc.ReadFrom(make([]byte, 1))
	assert.Error(t, err, "the packet conn must be closed")
	_, err = ln.Accept()
	assert.Error(t, err, "the listener must be closed")
}
