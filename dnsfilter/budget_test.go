package dnsfilter

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// budgetWorld is a server for two agents, a hostile one on 127.0.0.1 and
// a victim on 127.0.0.3, in front of an upstream that answers names under
// slow.test only after a delay.
type budgetWorld struct {
	srv     *Server
	log     *egresslog.Log
	addr    string
	release chan struct{} // closing it lets slow answers go
	slowAsk atomic.Int32

	mu    sync.Mutex
	asked map[string]int // the upstream's questions, by name
}

// upstreamAsked is how many times the upstream was asked name.
func (w *budgetWorld) upstreamAsked(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.asked[dns.Fqdn(name)]
}

func newBudgetWorld(t *testing.T, quotas policy.Quotas, configure func(*Server)) *budgetWorld {
	w := &budgetWorld{log: &egresslog.Log{}, release: make(chan struct{}), asked: map[string]int{}}
	upstream := dns.HandlerFunc(func(rw dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		name := r.Question[0].Name
		w.mu.Lock()
		w.asked[name]++
		w.mu.Unlock()
		if strings.HasSuffix(name, ".slow.test.") {
			w.slowAsk.Add(1)
			<-w.release
		}
		if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(name + " 60 IN A 140.82.112.3")
			m.Answer = append(m.Answer, rr)
		}
		rw.WriteMsg(m)
	})
	upPC, upLn := testkit.ListenDNS(t)
	testkit.ServeDNS(t, upstream, upPC, upLn)
	// Cleanups run last first: slow answers go before the servers stop.
	t.Cleanup(func() {
		select {
		case <-w.release:
		default:
			close(w.release)
		}
	})
	pol, err := policy.New(policy.Config{Allow: []string{"*.slow.test", "*.fast.test"}, Quotas: quotas})
	require.NoError(t, err)
	w.srv = &Server{
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) {
			switch src {
			case netip.MustParseAddr("127.0.0.1"):
				return "hostile", pol, true
			case netip.MustParseAddr("127.0.0.3"):
				return "victim", pol, true
			}
			return "", nil, false
		},
		Upstreams: []string{upPC.LocalAddr().String()},
		Log:       w.log,
		Timeout:   10 * time.Second,
	}
	if configure != nil {
		configure(w.srv)
	}
	pc, ln := testkit.ListenDNS(t)
	w.addr = pc.LocalAddr().String()
	served := make(chan error, 1)
	go func() { served <- w.srv.Serve(pc, ln) }()
	t.Cleanup(func() {
		w.srv.Close()
		<-served
	})
	return w
}

// ask sends one query from source and returns the rcode.
func (w *budgetWorld) ask(t *testing.T, source, name string) int {
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(source)}}}
	m := new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA)
	resp, _, err := c.Exchange(m, w.addr)
	if !assert.NoError(t, err, "%s asking %s", source, name) {
		return -1
	}
	return resp.Rcode
}

// TestAgentInFlightBudget: one agent's flood of slow names fills its own
// share of the upstream's slots; the other agent's queries and the
// gateway's own lookups go on.
func TestAgentInFlightBudget(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{DNSQueriesPerSecond: -1}, func(s *Server) {
		s.MaxInFlight, s.MaxInFlightPerAgent = 32, 8
	})
	var flood sync.WaitGroup
	var servfail atomic.Int32
	for i := range 40 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			if w.ask(t, "127.0.0.1", fmt.Sprintf("n%d.slow.test", i)) == dns.RcodeServerFailure {
				servfail.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return w.slowAsk.Load() == 8 }, 5*time.Second, 10*time.Millisecond, "the hostile agent fills its share")
	require.Eventually(t, func() bool { return servfail.Load() == 32 }, 5*time.Second, 10*time.Millisecond, "the rest of its flood is refused at once")

	for i := range 10 {
		assert.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.3", fmt.Sprintf("v%d.fast.test", i)), "the victim's uncached query")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := w.srv.LookupNetIP(ctx, "ip4", "gw.fast.test")
	require.NoError(t, err, "the gateway's own lookup")
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("140.82.112.3")}, addrs)

	rec := testkit.WaitRecord(t, w.log, func(r egresslog.Record) bool {
		return r.Agent == "hostile" && r.Reason == ReasonAgentOverloaded
	})
	assert.Equal(t, dns.RcodeServerFailure, rec.Status)
	assert.False(t, rec.Allowed, "a query refused for the agent's budget is a denial")
	assert.Contains(t, BoundReasons(), rec.Reason, "the refusal is not counted as a bound's")
	close(w.release)
	flood.Wait()
	assert.EqualValues(t, 8, w.slowAsk.Load(), "refused queries never went upstream")
}

// TestGatewayLookupsHonourTheirContext: the gateway's own lookup of a name
// whose upstream stalls ends with its context.
func TestGatewayLookupsHonourTheirContext(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := w.srv.LookupNetIP(ctx, "ip4", "stalled.slow.test")
	require.Error(t, err)
	assert.Less(t, time.Since(start), 2*time.Second, "the lookup waited past its context")
}

// TestDNSQueryRate: beyond its quota an agent is refused at once, with a
// record saying so; the other agent is untouched.
func TestDNSQueryRate(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{DNSQueriesPerSecond: 5}, nil) // bursts of 10
	refused := 0
	for i := range 30 {
		if w.ask(t, "127.0.0.1", fmt.Sprintf("r%d.fast.test", i)) == dns.RcodeRefused {
			refused++
		}
	}
	assert.GreaterOrEqual(t, refused, 15, "the hostile agent's queries beyond its burst")
	assert.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.3", "ok.fast.test"), "the victim has its own bucket")
	rec := testkit.WaitRecord(t, w.log, func(r egresslog.Record) bool { return r.Reason == policy.ReasonQuotaDNS })
	assert.Equal(t, "hostile", rec.Agent)
	assert.False(t, rec.Allowed)
}

// TestForgetStartsTheRateAfresh: an agent removed and made again under
// the same name has its whole burst, not what the removed one left.
func TestForgetStartsTheRateAfresh(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{DNSQueriesPerSecond: 1}, nil) // bursts of 2
	for i := range 2 {
		require.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.1", fmt.Sprintf("r%d.fast.test", i)), "the burst")
	}
	require.Equal(t, dns.RcodeRefused, w.ask(t, "127.0.0.1", "r2.fast.test"), "past the burst")
	w.srv.Forget("hostile")
	for i := range 2 {
		assert.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.1", fmt.Sprintf("s%d.fast.test", i)), "the agent made again under the name")
	}
}

// TestGatewayLookupsChargeTheirAgent: the gateway's lookups for one agent's
// connections (a flood of new names) fill that agent's share of the
// gateway's budget only; a lookup for another agent, or for none, goes on.
func TestGatewayLookupsChargeTheirAgent(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{}, func(s *Server) {
		s.GatewayInFlight, s.GatewayInFlightPerAgent = 16, 4
	})
	hostile := policy.WithAgent(context.Background(), "hostile")
	var flood sync.WaitGroup
	var busy atomic.Int32
	for i := range 10 {
		flood.Go(func() {
			ctx, cancel := context.WithTimeout(hostile, 5*time.Second)
			defer cancel()
			if _, err := w.srv.LookupNetIP(ctx, "ip4", fmt.Sprintf("n%d.slow.test", i)); err != nil && strings.Contains(err.Error(), ReasonGatewayBusy) {
				busy.Add(1)
			}
		})
	}
	require.Eventually(t, func() bool { return w.slowAsk.Load() == 4 }, 5*time.Second, 10*time.Millisecond, "the hostile agent fills its share")
	require.Eventually(t, func() bool { return busy.Load() == 6 }, 5*time.Second, 10*time.Millisecond, "the rest is refused at once")
	assert.Subset(t, BoundReasons(), []string{ReasonGatewayBusy, ReasonOverloaded}, "the refusals are not counted as a bound's")
	for _, ctx := range []context.Context{policy.WithAgent(context.Background(), "victim"), context.Background()} {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := w.srv.LookupNetIP(ctx, "ip4", fmt.Sprintf("v%d.fast.test", time.Now().UnixNano()))
		cancel()
		require.NoError(t, err, "a lookup for %q", policy.AgentFrom(ctx))
		assert.Equal(t, []netip.Addr{netip.MustParseAddr("140.82.112.3")}, addrs)
	}
	close(w.release)
	flood.Wait()
}

// TestTCPConnectionsBoundedPerSource: one source cannot hold open more
// than its share of DNS-over-TCP connections.
func TestTCPConnectionsBoundedPerSource(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{}, nil)
	for range DefaultMaxTCPConnsPerSource {
		c, err := net.Dial("tcp", w.addr)
		require.NoError(t, err)
		defer c.Close()
	}
	// The server accepts in the order the kernel queued the connections:
	// those above are counted before this one is.
	c, err := net.Dial("tcp", w.addr)
	if err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	require.Error(t, err)
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "a connection beyond the bound was kept open")
	assert.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.3", "v.fast.test"), "another source is served")
}

// TestGatewayWideOverloadIsNamed: a query refused because all agents
// together fill the gateway's places, at the door (queries being
// answered) or upstream (queries in flight), is recorded with the
// gateway's reason, not as its own agent's bound.
func TestGatewayWideOverloadIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name string
		fill func(s *Server) bool
		n    int
	}{
		{"at the door", func(s *Server) bool { return s.handling.Acquire("victim", 0, 0) }, 8},
		{"upstream", func(s *Server) bool { return s.inFlight.Acquire("victim", 0, 0) }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newBudgetWorld(t, policy.Quotas{DNSQueriesPerSecond: -1}, func(s *Server) {
				s.MaxInFlight, s.MaxInFlightPerAgent = 4, 4
			})
			for range tc.n {
				require.True(t, tc.fill(w.srv)) // the other agent's, held
			}
			assert.Equal(t, dns.RcodeServerFailure, w.ask(t, "127.0.0.1", "q.fast.test"))
			rec := testkit.WaitRecord(t, w.log, func(r egresslog.Record) bool { return r.Agent == "hostile" && !r.Allowed })
			assert.Equal(t, ReasonOverloaded, rec.Reason, "the agent held none of the places")
			assert.Contains(t, BoundReasons(), rec.Reason)
		})
	}
}

// TestCacheFloodEvictsTheFlooder: an agent that fills the answer cache
// with names of its own makes room from its own answers: its neighbour's
// stay cached, and its neighbour's next queries do not wait for the
// upstream again.
func TestCacheFloodEvictsTheFlooder(t *testing.T) {
	w := newBudgetWorld(t, policy.Quotas{DNSQueriesPerSecond: -1}, func(s *Server) { s.CacheSize = 50 })
	victim := func(i int) string { return fmt.Sprintf("v%d.fast.test", i) }
	for i := range 10 {
		require.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.3", victim(i)))
	}
	for i := range 200 {
		require.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.1", fmt.Sprintf("n%d.fast.test", i)))
	}
	for i := range 10 {
		require.Equal(t, dns.RcodeSuccess, w.ask(t, "127.0.0.3", victim(i)))
		assert.Equal(t, 1, w.upstreamAsked(victim(i)), "%s was evicted by the other agent's flood", victim(i))
	}
	assert.Greater(t, w.upstreamAsked("n0.fast.test"), 0)
}
