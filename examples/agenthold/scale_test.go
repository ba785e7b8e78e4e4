//go:build linux && !race

// The scale test measures rates and memory: under the race detector those
// figures would describe the detector, so it runs without it (make test
// does).

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/examples/netns"
)

// scaleAgents is how many agents the scale test holds on one gateway.
const scaleAgents = 1000

// TestThousandAgents grows one gateway to a thousand agents and measures
// what an agent costs there: how long creating and deleting one takes,
// and changing its policy, the gateway's memory per idle agent, and one
// agent's DNS queries and new connections per second, each against the
// same with the gateway's first few agents, in the same run. It asserts
// that every agent got a network of its own and that every measured
// operation succeeded; the figures are logged. Bounded: a thousand
// agents, a few seconds of load per phase.
func TestThousandAgents(t *testing.T) {
	w := requireWorld(t)
	api := (&cliEnv{socket: w.socket}).client()
	gw := &gatewayUsage{pid: w.server.Process.Pid}

	// The measuring agent: open, without quotas, so that the rates are
	// the gateway's and not a quota's.
	spec := AgentSpec{Name: "scale0", Policy: PolicySpec{Mode: "open", Quotas: QuotaSpec{ConnectionsPerSecond: -1, DNSQueriesPerSecond: -1}}}
	created := []string{}
	t.Cleanup(func() {
		for _, name := range created {
			api.do(http.MethodDelete, "/v1/agents/"+name, nil, nil)
		}
	})
	var info AgentInfo
	require.NoError(t, api.do(http.MethodPost, "/v1/agents", spec, &info))
	created = append(created, "scale0")
	ns := &netns.NS{Name: nsName(filepath.Join(w.dir, "data"), "scale0")}

	lifecycle := func() (create, del, policy time.Duration) {
		var cs, ds, ps []time.Duration
		for i := range 5 {
			name := fmt.Sprintf("probe%d", i)
			start := time.Now()
			require.NoError(t, api.do(http.MethodPost, "/v1/agents", AgentSpec{Name: name}, nil))
			cs = append(cs, time.Since(start))
			start = time.Now()
			require.NoError(t, api.do(http.MethodPut, "/v1/agents/"+name+"/policy", PolicySpec{Mode: "allowlist", Allow: []string{"github.com"}}, nil))
			ps = append(ps, time.Since(start))
			start = time.Now()
			require.NoError(t, api.do(http.MethodDelete, "/v1/agents/"+name, nil, nil))
			ds = append(ds, time.Since(start))
		}
		return percentile(cs, 50), percentile(ds, 50), percentile(ps, 50)
	}
	type phase struct {
		agents                 int
		create, delete, policy time.Duration
		dnsPerSec, connsPerSec float64
	}
	measure := func(agents int) phase {
		p := phase{agents: agents}
		p.create, p.delete, p.policy = lifecycle()
		// The best of three rounds each: on a small machine one round can
		// lose its share of the CPU to whatever else runs.
		for range 3 {
			p.dnsPerSec = max(p.dnsPerSec, dnsRate(t, ns, time.Second))
			p.connsPerSec = max(p.connsPerSec, connRate(t, ns, 800))
		}
		return p
	}
	before := measure(len(w.agentInfos(t)))

	rssBefore := gw.statusKB("VmRSS") << 10
	nets := map[netip.Addr]string{}
	for _, a := range w.agentInfos(t) {
		nets[netip.MustParseAddr(a.Gateway4)] = a.Name
	}
	start := time.Now()
	for i := len(nets); i < scaleAgents; i++ {
		name := fmt.Sprintf("scale%d", i)
		var a AgentInfo
		require.NoError(t, api.do(http.MethodPost, "/v1/agents", AgentSpec{Name: name}, &a), "agent %d", i)
		created = append(created, name)
		gw4 := netip.MustParseAddr(a.Gateway4)
		require.NotContains(t, nets, gw4, "%s was given %s's network", name, nets[gw4])
		nets[gw4] = name
	}
	grown := time.Since(start)
	rssAfter := gw.statusKB("VmRSS") << 10
	idleCPU := cpuTime(t, w.server.Process.Pid)
	time.Sleep(2 * time.Second)
	idleCPU = cpuTime(t, w.server.Process.Pid) - idleCPU
	require.Len(t, w.agentInfos(t), scaleAgents)
	after := measure(scaleAgents)

	perAgent := float64(rssAfter-rssBefore) / float64(scaleAgents-before.agents) / 1024
	t.Logf("%d agents created in %v; the gateway's RSS %d MiB before, %d MiB after: %.0f KiB per idle agent; idle, it used %v of CPU in 2 s",
		scaleAgents-before.agents, grown.Round(time.Millisecond), rssBefore>>20, rssAfter>>20, perAgent, idleCPU)
	t.Logf("  %-28s %12s %12s %8s", "", fmt.Sprintf("%d agents", before.agents), fmt.Sprintf("%d agents", after.agents), "ratio")
	for _, row := range []struct {
		name string
		a, b float64
	}{
		{"create an agent (ms)", millis(before.create), millis(after.create)},
		{"delete an agent (ms)", millis(before.delete), millis(after.delete)},
		{"set an agent's policy (ms)", millis(before.policy), millis(after.policy)},
		{"DNS queries per second", before.dnsPerSec, after.dnsPerSec},
		{"new connections per second", before.connsPerSec, after.connsPerSec},
	} {
		t.Logf("  %-28s %12.1f %12.1f %8.2f", row.name, row.a, row.b, row.b/row.a)
	}
}

// cpuTime is the CPU time process pid has used, user and system.
func cpuTime(t *testing.T, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	// The fields after the command's parenthesis: utime and stime are the
	// 12th and 13th of them, in clock ticks (100 a second).
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dnsRate asks the agent's DNS for a cached name from inside ns, from
// four resolvers at once, for d (at most 100,000 queries), and returns
// the answers per second.
func dnsRate(t *testing.T, ns *netns.NS, d time.Duration) float64 {
	t.Helper()
	_, err := exchangeIn(ns, "github.com.") // cached from here on
	require.NoError(t, err)
	var answered, failed atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	start := time.Now()
	for range 4 {
		wg.Go(func() {
			c, err := dialIn(ns, "udp", internetDNS+":53")
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			conn := &dns.Conn{Conn: c}
			client := &dns.Client{Timeout: time.Second}
			m := new(dns.Msg)
			m.SetQuestion("github.com.", dns.TypeA)
			for i := 0; i < 25000 && time.Now().Before(end); i++ {
				m.Id = dns.Id()
				if resp, _, err := client.ExchangeWithConn(m, conn); err == nil && resp.Rcode == dns.RcodeSuccess {
					answered.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// A stub resolver retries a lost datagram; these do not, and count it.
	assert.Less(t, float64(failed.Load()), 0.01*float64(answered.Load()+1), "DNS queries that failed: %d", failed.Load())
	return float64(answered.Load()) / time.Since(start).Seconds()
}

// connRate opens n connections from inside ns to a server that speaks
// first, passed through by name, each read to its greeting and closed,
// from four clients at once, and returns the connections per second.
// Every connection leaves a socket in TIME_WAIT on the client and on the
// gateway for a minute, and the kernel's search for a free port slows as
// they fill the range: n is kept to a tenth of it, so that what is
// measured is the gateway.
func connRate(t *testing.T, ns *netns.NS, n int) float64 {
	t.Helper()
	_, err := exchangeIn(ns, "ssh.example.net.") // the name the connections are judged by
	require.NoError(t, err)
	var opened, failed, next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 4 {
		wg.Go(func() {
			ns.Do(func() error { // the whole loop on a thread inside ns
				for next.Add(1) <= int64(n) {
					c, err := net.DialTimeout("tcp", "198.18.10.5:22", 5*time.Second)
					if err != nil {
						failed.Add(1)
						continue
					}
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
						opened.Add(1)
					} else {
						failed.Add(1)
					}
					c.Close()
				}
				return nil
			})
		})
	}
	wg.Wait()
	assert.Zero(t, failed.Load(), "connections that failed")
	return float64(opened.Load()) / time.Since(start).Seconds()
}
