//go:build linux && !race

// The noisy-neighbour load test measures latency and the gateway's peak
// use of descriptors and memory: under the race detector those figures
// would describe the detector, so it runs without it (make test does).

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/tproxy"
)

// TestNoisyNeighbour runs two agents on one gateway. bob, hostile, at
// once: floods DNS with unique names under a slow zone, opens HTTP/2
// streams by the thousand through an intercepted host, opens connections
// past its cap, floods the explicit proxy with plain-HTTP requests to a
// slow server, and with CONNECTs to unique names under the slow zone
// (which the gateway must look up itself). alice meanwhile resolves new names and makes HTTPS
// requests, intercepted and passed through, each on a new connection. It
// asserts that every one of alice's operations succeeds, idle and under
// attack, that bob's refusals are counted in /metrics, and that the
// gateway's descriptors stay within the bounds its caps imply; it reports
// alice's latencies and the gateway's peak descriptors and memory.
func TestNoisyNeighbour(t *testing.T) {
	w := requireWorld(t)
	data := filepath.Join(w.dir, "data")
	alice, bob := &netns.NS{Name: nsName(data, "alice")}, &netns.NS{Name: nsName(data, "bob")}

	// bob may go anywhere public, and has a credential for the slow
	// service, so that its HTTPS there is intercepted.
	require.NoError(t, w.cli(io.Discard, "policy", "set", "bob", "--mode", "open"))
	put := exec.Command(w.self, "secret", "put", "slow", "--host", "slow.example.com", "--header", "X-Key")
	put.Env = w.env()
	put.Stdin = strings.NewReader("slow-service-key")
	out, err := put.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, w.cli(io.Discard, "secret", "attach", "bob", "slow", "--env", "SLOW_KEY"))
	placeholder, err := w.inSandbox("alice", "printenv ANTHROPIC_API_KEY")
	require.NoError(t, err)
	placeholder = strings.TrimSpace(placeholder)
	gatewayCA := certPool(t, filepath.Join(data, "egress", "ca.crt"))
	bobInfo := w.agentInfo(t, "bob")
	explicit := net.JoinHostPort(bobInfo.Gateway4, "15002")

	v := &victim{ns: alice, placeholder: placeholder, gatewayCA: gatewayCA, publicRoots: certPool(t, w.internet.rootFile)}
	idle := v.run(t, 6*time.Second)

	gw := &gatewayUsage{pid: w.server.Process.Pid}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	sampling := gw.sample(ctx)
	h := &hostile{ns: bob, gatewayCA: gatewayCA, explicit: explicit}
	attacking := h.start(ctx)
	require.Eventually(t, h.underWay, 20*time.Second, 50*time.Millisecond, "the floods did not get under way: %s", h.summary())
	attacked := v.run(t, 10*time.Second)
	cancel()
	attacking.Wait()
	sampling.Wait()

	t.Logf("victim (alice), %d operations idle and %d under attack:", idle.total(), attacked.total())
	t.Logf("  %-12s %8s %8s %8s %8s %7s %9s", "operation", "p50 idle", "p99 idle", "p50 att", "p99 att", "p99 ×", "succeeded")
	for _, kind := range victimOps {
		i, a := idle.latencies[kind], attacked.latencies[kind]
		ratio := float64(percentile(a, 99)) / float64(max(percentile(i, 99), 1))
		t.Logf("  %-12s %8s %8s %8s %8s %7.2f %4d/%-4d", kind, ms(percentile(i, 50)), ms(percentile(i, 99)),
			ms(percentile(a, 50)), ms(percentile(a, 99)), ratio, len(a), len(a)+len(attacked.failures[kind]))
	}
	t.Logf("attacker (bob): %s", h.summary())
	t.Logf("gateway: peak %d file descriptors, peak RSS %d MiB (%d MiB before the attack)", gw.peakFDs.Load(), gw.peakRSS()>>20, gw.startRSS>>20)

	for _, r := range []*victimResult{idle, attacked} {
		for kind, errs := range r.failures {
			assert.Empty(t, errs[:min(len(errs), 5)], "alice's %s operations that failed (%s): %d, the first shown", kind, r.phase, len(errs))
		}
		for _, kind := range victimOps {
			assert.NotEmpty(t, r.latencies[kind], "alice made no %s operation (%s)", kind, r.phase)
		}
	}
	assert.Positive(t, h.dnsSent.Load(), "the DNS flood sent nothing")
	assert.Positive(t, h.connsOpened.Load(), "the connection flood opened nothing")
	// Each of bob's connections holds at most two descriptors (its own and
	// the upstream one); alice's, the pools and the listeners add little.
	bound := int64(2*tproxy.DefaultMaxConnsPerAgent + mitm.DefaultMaxUpstreamConnsPerAgent + 1000)
	assert.Less(t, gw.peakFDs.Load(), bound, "the gateway's descriptors under attack")

	var metrics strings.Builder
	require.NoError(t, w.cli(&metrics, "metrics"))
	for _, quota := range []string{"new connections per second", "DNS queries per second"} {
		assert.Contains(t, metrics.String(), fmt.Sprintf(`agenthold_egress_quota_exceeded_total{agent="bob",quota=%q}`, quota))
	}
	assert.NotContains(t, metrics.String(), `agenthold_egress_quota_exceeded_total{agent="alice"`)
}

// victimOps are what alice does, in turn.
var victimOps = []string{"dns", "intercepted", "passthrough"}

type victim struct {
	ns          *netns.NS
	placeholder string
	gatewayCA   *x509.CertPool
	publicRoots *x509.CertPool
	seq         atomic.Int64
}

type victimResult struct {
	phase     string
	latencies map[string][]time.Duration
	failures  map[string][]string
}

func (r *victimResult) total() int {
	n := 0
	for _, l := range r.latencies {
		n += len(l)
	}
	for _, f := range r.failures {
		n += len(f)
	}
	return n
}

// run performs alice's operations for d: two at a time, each followed by
// a pause, so that alice stays well within her own quotas (about 100
// operations a second).
func (v *victim) run(t *testing.T, d time.Duration) *victimResult {
	phase := "idle"
	if v.seq.Load() > 0 {
		phase = "under attack"
	}
	r := &victimResult{phase: phase, latencies: map[string][]time.Duration{}, failures: map[string][]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range 2 {
		wg.Go(func() {
			for i := 0; time.Now().Before(end) && i < 5000; i++ {
				kind := victimOps[i%len(victimOps)]
				start := time.Now()
				err := v.do(kind)
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					r.failures[kind] = append(r.failures[kind], err.Error())
				} else {
					r.latencies[kind] = append(r.latencies[kind], took)
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return r
}

func (v *victim) do(kind string) error {
	switch kind {
	case "dns":
		// A name never asked before, that the policy allows: the gateway
		// must ask upstream.
		name := fmt.Sprintf("v%d-%d.npmjs.org.", v.seq.Add(1), time.Now().UnixNano())
		rcode, err := exchangeIn(v.ns, name)
		if err != nil {
			return err
		}
		if rcode != dns.RcodeNameError && rcode != dns.RcodeSuccess {
			return fmt.Errorf("%s: %s", name, dns.RcodeToString[rcode])
		}
		return nil
	case "intercepted":
		v.seq.Add(1)
		return v.get("198.18.10.1:443", "https://api.anthropic.com/v1/models", v.gatewayCA, "demo-model")
	default:
		v.seq.Add(1)
		return v.get("198.18.10.7:443", "https://echo.example.com/", v.publicRoots, "")
	}
}

// get fetches url over a new connection to addr made in the victim's
// namespace, and checks the answer.
func (v *victim) get(addr, url string, roots *x509.CertPool, want string) error {
	tr := &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialIn(v.ns, "tcp", addr)
		},
	}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("x-api-key", v.placeholder)
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("%s: %s: %.100s", url, resp.Status, body)
	}
	return nil
}

// hostile is bob's four floods.
type hostile struct {
	ns        *netns.NS
	gatewayCA *x509.CertPool
	explicit  string

	dnsSent, dnsAnswered, dnsRefused         atomic.Int64
	streamsOpened, streamsRefused            atomic.Int64
	connsOpened, connsRefused                atomic.Int64
	explicitSent, explicitOK, explicitDenied atomic.Int64
	connectSent, connectRefused              atomic.Int64
}

func (h *hostile) summary() string {
	return fmt.Sprintf("DNS %d sent, %d answered, %d refused or failed; HTTP/2 %d streams opened, %d reset by the gateway; "+
		"connections %d opened, %d refused or cut; explicit proxy %d requests, %d answered 200, %d refused; "+
		"CONNECT to new names %d, %d refused",
		h.dnsSent.Load(), h.dnsAnswered.Load(), h.dnsRefused.Load(), h.streamsOpened.Load(), h.streamsRefused.Load(),
		h.connsOpened.Load(), h.connsRefused.Load(), h.explicitSent.Load(), h.explicitOK.Load(), h.explicitDenied.Load(),
		h.connectSent.Load(), h.connectRefused.Load())
}

// underWay reports whether every flood has begun and the DNS flood has
// met its quota: the attack is on.
func (h *hostile) underWay() bool {
	return h.dnsRefused.Load() > 0 && h.streamsOpened.Load() > 0 && h.connsOpened.Load() > 0 &&
		h.explicitSent.Load() > 0 && h.connectSent.Load() > 0
}

// start runs the floods until ctx ends; each is bounded in count too.
func (h *hostile) start(ctx context.Context) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { h.dnsFlood(ctx, 100_000) })
	}
	for range 8 {
		wg.Go(func() { h.streamFlood(ctx, 2000) })
	}
	wg.Go(func() { h.connFlood(ctx, tproxy.DefaultMaxConnsPerAgent+500) })
	for range 100 {
		wg.Go(func() { h.explicitFlood(ctx, 1000) })
	}
	for range 10 {
		wg.Go(func() { h.connectFlood(ctx, 1000) })
	}
	return &wg
}

// dnsFlood sends queries for unique names under the slow zone as fast as
// it can, without waiting for answers.
func (h *hostile) dnsFlood(ctx context.Context, limit int) {
	c, err := dialIn(h.ns, "udp", internetDNS+":53")
	if err != nil {
		return
	}
	defer c.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) == nil && (m.Rcode == dns.RcodeNameError || m.Rcode == dns.RcodeSuccess) {
				h.dnsAnswered.Add(1)
			} else {
				h.dnsRefused.Add(1)
			}
		}
	}()
	m := new(dns.Msg)
	for i := 0; i < limit && ctx.Err() == nil; i++ {
		m.SetQuestion(fmt.Sprintf("h%d-%d%s", i, time.Now().UnixNano(), slowZone), dns.TypeA)
		packet, _ := m.Pack()
		if _, err := c.Write(packet); err != nil {
			time.Sleep(time.Millisecond) // the socket's buffer is full
			continue
		}
		h.dnsSent.Add(1)
	}
	<-ctx.Done()
}

// streamFlood opens HTTP/2 streams to the slow service through the
// gateway's interception, ignoring its concurrency limit, in batches.
func (h *hostile) streamFlood(ctx context.Context, limit int) {
	raw, err := dialIn(h.ns, "tcp", "198.18.10.8:443")
	if err != nil {
		return
	}
	c := tls.Client(raw, &tls.Config{ServerName: "slow.example.com", RootCAs: h.gatewayCA, NextProtos: []string{"h2"}})
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if c.HandshakeContext(ctx) != nil || c.ConnectionState().NegotiatedProtocol != "h2" {
		return
	}
	var wmu sync.Mutex
	fr := http2.NewFramer(c, c)
	c.Write([]byte(http2.ClientPreface))
	fr.WriteSettings()
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				h.streamsRefused.Add(1)
			case *http2.SettingsFrame:
				if !f.IsAck() {
					wmu.Lock()
					fr.WriteSettingsAck()
					wmu.Unlock()
				}
			}
		}
	}()
	var hb strings.Builder
	enc := hpack.NewEncoder(&hb)
	id := uint32(1)
	for sent := 0; sent < limit && ctx.Err() == nil; {
		for range 250 {
			hb.Reset()
			for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "slow.example.com"}, {":path", "/"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			wmu.Lock()
			err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte(hb.String()), EndStream: true, EndHeaders: true})
			wmu.Unlock()
			if err != nil {
				return
			}
			id += 2
			sent++
			h.streamsOpened.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	<-ctx.Done()
}

// connFlood opens connections to the slow service's plain HTTP port,
// each with a request in flight, and holds them, past the agent's cap.
func (h *hostile) connFlood(ctx context.Context, limit int) {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for len(conns) < limit && ctx.Err() == nil {
		c, err := dialIn(h.ns, "tcp", "198.18.10.8:80")
		if err != nil {
			h.connsRefused.Add(1)
			continue
		}
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: slow.example.com\r\n\r\n"); err != nil {
			h.connsRefused.Add(1)
			c.Close()
			continue
		}
		h.connsOpened.Add(1)
		conns = append(conns, c)
	}
	<-ctx.Done()
}

// explicitFlood sends absolute-form requests for the slow service to the
// explicit proxy, one after another on one connection, reconnecting when
// the proxy closes it.
func (h *hostile) explicitFlood(ctx context.Context, limit int) {
	for sent := 0; sent < limit && ctx.Err() == nil; {
		c, err := dialIn(h.ns, "tcp", h.explicit)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		br := bufio.NewReader(c)
		for ; sent < limit; sent++ {
			if _, err := io.WriteString(c, "GET http://slow.example.com/ HTTP/1.1\r\nHost: slow.example.com\r\n\r\n"); err != nil {
				break
			}
			h.explicitSent.Add(1)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				break
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				h.explicitOK.Add(1)
			} else {
				h.explicitDenied.Add(1)
			}
			if resp.Close {
				break
			}
		}
		stop()
		c.Close()
	}
}

// connectFlood asks the explicit proxy for tunnels to names never seen,
// under the slow zone: the gateway looks each up before it answers.
func (h *hostile) connectFlood(ctx context.Context, limit int) {
	for i := 0; i < limit && ctx.Err() == nil; i++ {
		c, err := dialIn(h.ns, "tcp", h.explicit)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		name := fmt.Sprintf("c%d-%d%s", i, time.Now().UnixNano(), strings.TrimSuffix(slowZone, "."))
		fmt.Fprintf(c, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", name, name)
		h.connectSent.Add(1)
		if resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != http.StatusOK {
			h.connectRefused.Add(1)
		}
		stop()
		c.Close()
	}
}

// dialIn dials from inside ns.
func dialIn(ns *netns.NS, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	return c, err
}

// exchangeIn asks the agent's DNS (any address: the rules redirect port
// 53 to the gateway) for name's A record, from inside ns, as a stub
// resolver does: a second try when the first gets no answer in 2.5 s
// (UDP under a neighbour's flood loses packets in the kernel's queues,
// which every resolver retries), 5 s in all.
func exchangeIn(ns *netns.NS, name string) (int, error) {
	var err error
	for range 2 {
		var rcode int
		if rcode, err = exchangeOnce(ns, name); err == nil {
			return rcode, nil
		}
	}
	return 0, err
}

func exchangeOnce(ns *netns.NS, name string) (int, error) {
	c, err := dialIn(ns, "udp", internetDNS+":53")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	resp, _, err := (&dns.Client{Timeout: 2500 * time.Millisecond}).ExchangeWithConn(m, &dns.Conn{Conn: c})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return resp.Rcode, nil
}

// gatewayUsage samples the gateway process's descriptors and memory.
type gatewayUsage struct {
	pid      int
	peakFDs  atomic.Int64
	startRSS int64
}

func (g *gatewayUsage) sample(ctx context.Context) *sync.WaitGroup {
	g.startRSS = g.statusKB("VmRSS") << 10
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", g.pid)); err == nil && int64(len(fds)) > g.peakFDs.Load() {
				g.peakFDs.Store(int64(len(fds)))
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return &wg
}

// peakRSS is the process's high-water mark of resident memory.
func (g *gatewayUsage) peakRSS() int64 { return g.statusKB("VmHWM") << 10 }

func (g *gatewayUsage) statusKB(field string) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.pid))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func certPool(t *testing.T, path string) *x509.CertPool {
	pem, err := os.ReadFile(path)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pem), "no certificate in %s", path)
	return pool
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }
