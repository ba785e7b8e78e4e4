//go:build linux

package tproxy

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy/fastpath"
)

// benchProxy runs a transparent proxy on loopback whose every connection
// is "redirected" to dst, the upstream, judged by the remembered name
// bench.test (resolved by a map, as dnsfilter's cache would), set up
// further by configure.
func benchProxy(b *testing.B, dst netip.AddrPort, configure ...func(*Proxy)) string {
	b.Helper()
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(b, err)
	// No rate quota: the benchmarks open connections as fast as they can.
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"bench.test:*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(b, err)
	p := &Proxy{
		Agents:           func(netip.Addr) (string, *policy.Policy, bool) { return "bench", pol, true },
		Names:            func(string, netip.Addr) []string { return []string{"bench.test"} },
		Guard:            guard,
		Resolver:         testkit.Resolver{"bench.test": {dst.Addr()}},
		OriginalDst:      func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil },
		MaxConns:         1 << 20,
		MaxConnsPerAgent: 1 << 20,
	}
	for _, f := range configure {
		f(p)
	}
	ln, err := Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	go p.Serve(ln)
	b.Cleanup(func() { p.Close() })
	return ln.Addr().String()
}

// serveBench runs an upstream on 127.0.0.2 with a handler per connection.
func serveBench(b *testing.B, handle func(net.Conn)) netip.AddrPort {
	ln := listenLoop(b, "127.0.0.2:0")
	go acceptLoop(ln, handle)
	return netip.MustParseAddrPort(ln.Addr().String())
}

// BenchmarkBulkThroughput downloads b.N MiB on each of 1 and 4 streams,
// directly and through the proxy, interleaved in the same run, and
// reports both rates and their ratio; as root, through the proxy with
// the kernel path too, and that ratio, and the kernel path's to the
// proxy's own splicing relay.
func BenchmarkBulkThroughput(b *testing.B) {
	chunk := make([]byte, 1<<20)
	// The upstream sends the number of MiB the client asks for.
	up := serveBench(b, func(c net.Conn) {
		defer c.Close()
		req := make([]byte, 8)
		if _, err := io.ReadFull(c, req); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint64(req))
		for i := 0; i < n; i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	proxy := benchProxy(b, up)
	minimal := minimalSplice(b, up)
	var kernel string
	if kp := benchKernelPath(b); kp != nil {
		kernel = benchProxy(b, up, withKernelPath(kp))
	}
	for _, streams := range []int{1, 4} {
		busy := map[string]*machineCPU{} // by address: the machine's CPU per MiB moved through it
		run := func(addr string, mib int) float64 {
			var wg sync.WaitGroup
			if busy[addr] == nil {
				busy[addr] = new(machineCPU)
			}
			defer busy[addr].measure(float64(streams * mib))()
			start := time.Now()
			for range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := net.Dial("tcp", addr)
					if !assert.NoError(b, err) { // not the benchmark's goroutine: no FailNow
						return
					}
					defer c.Close()
					req := make([]byte, 8)
					binary.BigEndian.PutUint64(req, uint64(mib))
					c.Write(req)
					// Read as a downloader does, in large buffers, so the
					// client's own system calls do not swamp the figure.
					n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, c, make([]byte, 256<<10))
					assert.NoError(b, err, "received %d bytes", n)
					assert.Equal(b, int64(mib)<<20, n, "bytes received")
				}()
			}
			wg.Wait()
			return float64(streams*mib) / time.Since(start).Seconds() // MiB/s
		}
		via := func(relay string) func(n int, viaProxy bool) float64 {
			return func(n int, viaProxy bool) float64 {
				if viaProxy {
					return run(relay, n)
				}
				return run(up.String(), n)
			}
		}
		direct, proxied, ratio := interleave(b.N, via(proxy))
		_, _, minimalRatio := interleave(b.N/2, via(minimal))
		b.ReportMetric(direct, "direct-MiB/s-"+strconv.Itoa(streams))
		b.ReportMetric(proxied, "proxy-MiB/s-"+strconv.Itoa(streams))
		b.ReportMetric(ratio, "ratio-"+strconv.Itoa(streams))
		b.ReportMetric(minimalRatio, "minimal-relay-ratio-"+strconv.Itoa(streams))
		b.ReportMetric(busy[up.String()].perGiB(), "direct-cpu-ms/GiB-"+strconv.Itoa(streams))
		b.ReportMetric(busy[proxy].perGiB(), "proxy-cpu-ms/GiB-"+strconv.Itoa(streams))
		if kernel != "" {
			_, kernelRate, kernelRatio := interleave(b.N, via(kernel))
			b.ReportMetric(kernelRate, "kernel-MiB/s-"+strconv.Itoa(streams))
			b.ReportMetric(kernelRatio, "kernel-ratio-"+strconv.Itoa(streams))
			b.ReportMetric(kernelRate/proxied, "kernel/splice-"+strconv.Itoa(streams))
			b.ReportMetric(busy[kernel].perGiB(), "kernel-cpu-ms/GiB-"+strconv.Itoa(streams))
		}
	}
}

// BenchmarkWholeDownloads downloads a 60 MiB stream, each 8-byte word
// its own offset, b.N times on each of 4 streams at once, through the
// proxy on the kernel path and on its splicing relay in turn, and
// reports the share of downloads on each that did not come out whole
// (shorter, longer, or a word out of place), and the share of downloads
// the kernel path took (the rest stayed on the relay, whole or not).
// Where one did not come out whole, it logs what the client got and where
// it first went wrong. As root only: the kernel path needs it.
// go test -run X -bench WholeDownloads -benchtime 200x ./tproxy
func BenchmarkWholeDownloads(b *testing.B) {
	stream := make([]byte, 60<<20)
	for i := 0; i < len(stream); i += 8 {
		binary.BigEndian.PutUint64(stream[i:], uint64(i))
	}
	up := serveBench(b, func(c net.Conn) {
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
			c.Write(stream)
		}
	})
	kp := benchKernelPath(b)
	if kp == nil {
		b.Skip("no kernel path")
	}
	taken := &countedPath{KernelPath: kp}
	ways := []struct{ name, addr string }{
		{"kernel", benchProxy(b, up, withKernelPath(taken))},
		{"splice", benchProxy(b, up)},
	}
	broken := make([]atomic.Int64, len(ways))
	for range b.N {
		for k, way := range ways {
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					c, err := net.Dial("tcp", way.addr)
					if !assert.NoError(b, err) { // not the benchmark's goroutine: no FailNow
						return
					}
					defer c.Close()
					c.Write([]byte{0})
					got, err := io.ReadAll(c)
					if why := wholeStream(got, stream); err != nil || why != "" {
						b.Logf("%s: %d bytes of %d, %v: %s", way.name, len(got), len(stream), err, why)
						broken[k].Add(1)
					}
				})
			}
			wg.Wait()
		}
	}
	for k, way := range ways {
		b.ReportMetric(float64(broken[k].Load())/float64(4*b.N), way.name+"-broken/download")
	}
	b.ReportMetric(float64(taken.moved.Load())/float64(4*b.N), "kernel-taken/download")
}

// countedPath counts the connections its KernelPath took.
type countedPath struct {
	KernelPath
	moved atomic.Int64
}

func (c *countedPath) Move(client, upstream *net.TCPConn) (func() (int64, int64, error), func(), error) {
	wait, abort, err := c.KernelPath.Move(client, upstream)
	if err == nil {
		c.moved.Add(1)
	}
	return wait, abort, err
}

// BenchmarkTwoWayFloods sends 8 MiB, each 8-byte word its own offset, as
// fast as the client can write, to a mirror that sends back what it reads
// as it reads it, b.N times through the proxy on the kernel path and on
// its splicing relay in turn, and reports the share of floods on each
// that did not come back whole (logging where each went wrong, and
// whether the kernel path took it) and the share the kernel path took
// (the rest stayed on the relay). The kernel path takes such a connection
// after its first bytes; on the kernel fastpath.ErrSockmapDefect names, a
// few floods in a thousand come back with bytes repeated. As root only.
// go test -run X -bench TwoWayFloods -benchtime 1000x ./tproxy
func BenchmarkTwoWayFloods(b *testing.B) {
	sent := make([]byte, 8<<20)
	for i := 0; i < len(sent); i += 8 {
		binary.BigEndian.PutUint64(sent[i:], uint64(i))
	}
	kp := benchKernelPath(b)
	if kp == nil {
		b.Skip("no kernel path")
	}
	mirror := serveMirror(b)
	taken := &countedPath{KernelPath: kp}
	ways := []struct{ name, addr string }{
		{"kernel", benchProxy(b, mirror, withKernelPath(taken))},
		{"splice", benchProxy(b, mirror)},
	}
	broken := make([]int, len(ways))
	for range b.N {
		for k, way := range ways {
			before := taken.moved.Load()
			c, err := net.Dial("tcp", way.addr)
			require.NoError(b, err)
			go func() {
				for rest := sent; len(rest) > 0; rest = rest[min(len(rest), 64<<10):] {
					if _, err := c.Write(rest[:min(len(rest), 64<<10)]); err != nil {
						return
					}
				}
				c.(*net.TCPConn).CloseWrite()
			}()
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			back, err := io.ReadAll(c)
			c.Close()
			if why := wholeStream(back, sent); err != nil || why != "" {
				b.Logf("%s (the kernel path took it: %v): %d bytes of %d, %v: %s", way.name, taken.moved.Load() > before, len(back), len(sent), err, why)
				broken[k]++
			}
		}
	}
	for k, way := range ways {
		b.ReportMetric(float64(broken[k])/float64(b.N), way.name+"-broken/flood")
	}
	b.ReportMetric(float64(taken.moved.Load())/float64(b.N), "kernel-taken/flood")
}

// wholeStream says where got first differs from want, and what stands
// there, or "" where they are the same.
func wholeStream(got, want []byte) string {
	for i := 0; i+8 <= min(len(got), len(want)); i += 8 {
		if w := binary.BigEndian.Uint64(got[i:]); w != uint64(i) {
			return fmt.Sprintf("the word at %d is %#x", i, w)
		}
	}
	switch {
	case len(got) > len(want):
		return fmt.Sprintf("%d bytes more than sent", len(got)-len(want))
	case len(got) < len(want):
		return fmt.Sprintf("%d bytes short", len(want)-len(got))
	}
	return ""
}

// machineCPU adds up the whole machine's busy CPU time (every process,
// the kernel's threads and interrupts: the kernel path's work is done
// outside the gateway's process) over the runs it measures, and the MiB
// they moved.
type machineCPU struct {
	busy time.Duration
	mib  float64
}

// measure starts measuring a run that moves mib; the returned function
// ends it.
func (m *machineCPU) measure(mib float64) func() {
	start := machineBusy()
	return func() {
		m.busy += machineBusy() - start
		m.mib += mib
	}
}

// perGiB is the CPU milliseconds spent per GiB moved; 0 where
// /proc/stat cannot be read.
func (m *machineCPU) perGiB() float64 {
	if m == nil || m.mib == 0 {
		return 0
	}
	return float64(m.busy.Milliseconds()) / m.mib * 1024
}

// machineBusy is the machine's busy CPU time since boot, from
// /proc/stat's first line (user, nice, system, irq, softirq and steal, in
// hundredths of a second); 0 where it cannot be read.
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

func withKernelPath(kp KernelPath) func(*Proxy) { return func(p *Proxy) { p.KernelPath = kp } }

// benchKernelPath is a kernel path for a benchmark, or nil where there is
// none (not root, no kernel support): the benchmark then says why.
func benchKernelPath(b *testing.B) *fastpath.Path {
	if os.Getuid() != 0 {
		b.Log("no kernel path figures: they need root")
		return nil
	}
	kp, err := fastpath.NewDespiteDefect(1 << 14)
	if err != nil {
		b.Logf("no kernel path figures: %v", err)
		return nil
	}
	b.Cleanup(func() { kp.Close() })
	return kp
}

// interleave splits n units of work into rounds that alternate direct
// and proxied runs, so that both see the same machine, and returns the
// median rate of each and the median of the rounds' ratios.
func interleave(n int, run func(n int, viaProxy bool) float64) (direct, proxied, ratio float64) {
	const rounds = 5
	per := max(n/rounds, 1)
	var ds, ps, rs []float64
	for range rounds {
		d := run(per, false)
		p := run(per, true)
		ds, ps, rs = append(ds, d), append(ps, p), append(rs, p/d)
	}
	return median(ds), median(ps), median(rs)
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkNewConnections opens b.N short connections (one byte each way)
// from 8 clients, directly and through the proxy, interleaved, and reports
// connections per second and their ratio; as root, through the proxy with
// the kernel path too.
func BenchmarkNewConnections(b *testing.B) {
	up := serveBench(b, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 1)
		if _, err := c.Read(buf); err == nil {
			c.Write(buf)
		}
	})
	proxy := benchProxy(b, up)
	run := func(addr string, n int) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 1)
				for next.Add(1) <= int64(n) {
					c, err := net.Dial("tcp", addr)
					if !assert.NoError(b, err) { // not the benchmark's goroutine: no FailNow
						return
					}
					c.Write([]byte("x\n"))
					_, err = io.ReadFull(c, buf)
					assert.NoError(b, err)
					c.Close()
				}
			}()
		}
		wg.Wait()
		return float64(n) / time.Since(start).Seconds()
	}
	via := func(proxy string) func(n int, viaProxy bool) float64 {
		return func(n int, viaProxy bool) float64 {
			if viaProxy {
				return run(proxy, n)
			}
			return run(up.String(), n)
		}
	}
	direct, proxied, ratio := interleave(b.N, via(proxy))
	b.ReportMetric(direct, "direct-conn/s")
	b.ReportMetric(proxied, "proxy-conn/s")
	b.ReportMetric(ratio, "ratio")
	if kp := benchKernelPath(b); kp != nil {
		_, kernelRate, kernelRatio := interleave(b.N, via(benchProxy(b, up, withKernelPath(kp))))
		b.ReportMetric(kernelRate, "kernel-conn/s")
		b.ReportMetric(kernelRatio, "kernel-ratio")
	}
}

// BenchmarkLatency measures round trips of one byte on an open
// connection, directly and through the proxy, and reports the medians and
// what the proxy adds.
func BenchmarkLatency(b *testing.B) {
	up := serveBench(b, func(c net.Conn) {
		defer c.Close()
		io.Copy(c, c)
	})
	proxy := benchProxy(b, up)
	run := func(addr string) time.Duration {
		c, err := net.Dial("tcp", addr)
		require.NoError(b, err)
		defer c.Close()
		buf := []byte{'x'}
		rtts := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N+100; i++ {
			start := time.Now()
			c.Write(buf)
			// b.Fatal, not require: this is inside the timed round trip,
			// and require calls b.Helper (a lock and a stack walk) each time.
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
			if i >= 100 { // after warm-up
				rtts = append(rtts, time.Since(start))
			}
		}
		slices.Sort(rtts)
		return rtts[len(rtts)/2]
	}
	direct := run(up.String())
	proxied := run(proxy)
	b.ReportMetric(float64(direct.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(proxied.Microseconds()), "proxy-p50-µs")
	b.ReportMetric(float64((proxied-direct).Nanoseconds())/1e3, "added-p50-µs")
}

// BenchmarkIdleConnectionMemory holds b.N idle connections directly, then
// b.N through the proxy, in the same process, and reports the memory per
// connection that the proxy adds (Go heap and stacks, and resident set
// size): the difference between the two. A proxied connection costs four
// descriptors here (two in the proxy), so b.N is bounded by a quarter of
// the open file limit.
func BenchmarkIdleConnectionMemory(b *testing.B) {
	if err := raiseFileLimit(uint64(b.N)*4 + 256); err != nil {
		b.Skipf("the open file limit does not allow %d connections (four descriptors each): %v", b.N, err)
	}
	var held sync.WaitGroup
	up := serveBench(b, func(c net.Conn) {
		held.Done()
		io.Copy(io.Discard, c) // until the client goes
		c.Close()
	})
	proxy := benchProxy(b, up)
	// hold opens n idle connections to addr, waits until the upstream has
	// them all, and returns the memory they added and a way to close them.
	hold := func(addr string) (goBytes, rssBytes float64, closeAll func()) {
		runtime.GC()
		goBefore, rssBefore := testkit.GoMemory(), testkit.RSS()
		conns := make([]net.Conn, 0, b.N)
		held.Add(b.N)
		for i := 0; i < b.N; i++ {
			c, err := net.Dial("tcp", addr)
			require.NoError(b, err, "connection %d", i)
			c.Write([]byte("x\n")) // commit to other TCP, then idle
			conns = append(conns, c)
		}
		held.Wait()
		runtime.GC()
		goAfter, rssAfter := testkit.GoMemory(), testkit.RSS()
		return float64(goAfter) - float64(goBefore), float64(rssAfter) - float64(rssBefore), func() {
			for _, c := range conns {
				c.Close()
			}
		}
	}
	directGo, directRSS, closeDirect := hold(up.String())
	closeDirect()
	proxyGo, proxyRSS, closeProxied := hold(proxy)
	defer closeProxied()
	n := float64(b.N) * 1024
	b.ReportMetric((proxyGo-directGo)/n, "proxy-go-KiB/conn")
	b.ReportMetric((proxyRSS-directRSS)/n, "proxy-rss-KiB/conn")
	b.ReportMetric(proxyGo/n, "total-go-KiB/conn")
}

// raiseFileLimit raises the soft open file limit to n, and the hard one
// when the process may.
func raiseFileLimit(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= n {
		return nil
	}
	if lim.Max < n {
		lim.Cur, lim.Max = n, n
		return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	lim.Cur = n
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// BenchmarkServerFirstBanner connects b.N times to a server that speaks
// first (an SSH-style banner), directly and through the proxy (judged by
// the name the agent resolved), and reports the median time from connect
// to the banner's arrival on each path and what the proxy adds.
func BenchmarkServerFirstBanner(b *testing.B) {
	banner := []byte("SSH-2.0-bench\r\n")
	up := serveBench(b, func(c net.Conn) {
		c.Write(banner)
		io.Copy(io.Discard, c) // until the client goes
		c.Close()
	})
	proxy := benchProxy(b, up)
	run := func(addr string, n int) []time.Duration {
		buf := make([]byte, len(banner))
		out := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			// b.Fatal, not require, inside the timed span: see BenchmarkLatency.
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
			out = append(out, time.Since(start))
			c.Close()
		}
		return out
	}
	var direct, proxied []time.Duration
	per := max(b.N/5, 1)
	for range 5 {
		direct = append(direct, run(up.String(), per)...)
		proxied = append(proxied, run(proxy, per)...)
	}
	slices.Sort(direct)
	slices.Sort(proxied)
	d, p := direct[len(direct)/2], proxied[len(proxied)/2]
	b.ReportMetric(float64(d.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(p.Microseconds()), "proxy-p50-µs")
	b.ReportMetric(float64((p-d).Nanoseconds())/1e3, "added-p50-µs")
}

// BenchmarkNewTunnels opens b.N CONNECT tunnels from 8 clients, each a
// new TCP connection with one byte each way, through the explicit proxy
// and through a minimal CONNECT relay, interleaved with direct
// connections, and reports tunnels per second and the proxy's ratio to
// the relay.
func BenchmarkNewTunnels(b *testing.B) {
	up := serveBench(b, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 1)
		if _, err := c.Read(buf); err == nil {
			c.Write(buf)
		}
	})
	explicit := benchExplicit(b, up.Addr())
	minimal := minimalRelay(b, up.String())
	compareTunnels(b, up, explicit, minimal, "conn/s", func(c net.Conn) error {
		c.Write([]byte("x\n"))
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	})
}

// compareTunnels runs op on b.N new connections to up from 8 clients,
// directly and through a CONNECT tunnel of the explicit proxy, then
// directly and through the minimal relay, interleaved, and reports the
// rates (in unit) and the proxy's ratio to the relay.
func compareTunnels(b *testing.B, up netip.AddrPort, explicit, minimal, unit string, op func(net.Conn) error) {
	target := fmt.Sprintf("bench.test:%d", up.Port())
	run := func(proxy string) func(n int, viaProxy bool) float64 {
		return func(n int, viaProxy bool) float64 {
			return parallel(b, 8, n, func() error {
				var c net.Conn
				var err error
				if viaProxy {
					c, err = dialTunnel(proxy, target)
				} else {
					c, err = net.Dial("tcp", up.String())
				}
				if err != nil {
					return err
				}
				defer c.Close()
				return op(c)
			})
		}
	}
	direct, proxied, ratio := interleave(b.N/2, run(explicit))
	_, relayed, minimalRatio := interleave(b.N/2, run(minimal))
	b.ReportMetric(direct, "direct-"+unit)
	b.ReportMetric(proxied, "tunnel-"+unit)
	b.ReportMetric(relayed, "minimal-relay-"+unit)
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(minimalRatio, "minimal-relay-ratio")
	b.ReportMetric(ratio/minimalRatio, "vs-minimal-relay")
}

// dialTunnel opens a CONNECT tunnel to target through proxy.
func dialTunnel(proxy, target string) (net.Conn, error) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("CONNECT: %s", resp.Status)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return &bufferedConn{Conn: c, r: br}, nil
}

// parallel runs op n times from workers goroutines and returns how many
// it ran per second.
func parallel(b *testing.B, workers, n int, op func() error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if !assert.NoError(b, op()) { // not the benchmark's goroutine: no FailNow
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// benchExplicit runs the explicit proxy on loopback, allowing bench.test
// (at addr) with no rate quota, and returns its address.
func benchExplicit(b *testing.B, addr netip.Addr) string {
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(b, err)
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"bench.test:*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(b, err)
	p := &Proxy{
		Agents:   func(netip.Addr) (string, *policy.Policy, bool) { return "bench", pol, true },
		Guard:    guard,
		Resolver: testkit.Resolver{"bench.test": {addr}},
		MaxConns: 1 << 20, MaxConnsPerAgent: 1 << 20, MaxExplicitConnsPerSource: 1 << 20,
	}
	ln := listenLoop(b, "127.0.0.1:0")
	go p.ServeExplicit(ln)
	b.Cleanup(func() { p.Close() })
	return ln.Addr().String()
}

// BenchmarkTLSThroughTunnel opens b.N TLS 1.3 connections from 8 clients,
// each a new TCP connection and a full handshake, directly and through a
// CONNECT tunnel of the explicit proxy, interleaved, and reports
// handshakes per second and their ratio. The proxy dials the target
// before it answers the CONNECT, so the client's handshake meets a ready
// connection.
func BenchmarkTLSThroughTunnel(b *testing.B) {
	ca := testkit.NewCA(b)
	cert := ca.Issue(b, "bench.test")
	ln := listenLoop(b, "127.0.0.2:0")
	go acceptLoop(ln, func(c net.Conn) {
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
		tc.Handshake()
		io.Copy(io.Discard, tc) // until the client closes
		tc.Close()
	})
	up := netip.MustParseAddrPort(ln.Addr().String())
	explicit := benchExplicit(b, up.Addr())
	minimal := minimalRelay(b, up.String())
	compareTunnels(b, up, explicit, minimal, "handshakes/s", func(c net.Conn) error {
		return tls.Client(c, &tls.Config{ServerName: "bench.test", RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}).Handshake()
	})
}

// minimalSplice is the least a transparent relay can do, as a yardstick:
// dial, then io.Copy both ways (splice(2) between TCP connections).
func minimalSplice(b *testing.B, dst netip.AddrPort) string {
	ln := listenLoop(b, "127.0.0.1:0")
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		u, err := net.Dial("tcp", dst.String())
		if err != nil {
			return
		}
		defer u.Close()
		go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, u)
	})
	return ln.Addr().String()
}

// minimalRelay is the least a CONNECT proxy can do, as a yardstick: read
// the request, dial, answer, copy. No judgement, no guard, no record.
func minimalRelay(b *testing.B, up string) string {
	ln := listenLoop(b, "127.0.0.1:0")
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		u, err := net.Dial("tcp", up)
		if err != nil {
			return
		}
		defer u.Close()
		c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		go func() { io.Copy(u, br); u.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, u)
	})
	return ln.Addr().String()
}

// BenchmarkPlainRequests sends b.N plain HTTP requests on kept-alive
// connections from 8 clients, directly and through the explicit proxy
// (absolute-form, each judged, tracked and recorded on its own),
// interleaved, and reports requests per second and their ratio.
func BenchmarkPlainRequests(b *testing.B) {
	ln := listenLoop(b, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	up := netip.MustParseAddrPort(ln.Addr().String())
	explicit := benchExplicit(b, up.Addr())
	direct := &http.Transport{MaxIdleConnsPerHost: 8}
	viaProxy := &http.Transport{MaxIdleConnsPerHost: 8, Proxy: func(*http.Request) (*url.URL, error) { return url.Parse("http://" + explicit) }}
	b.Cleanup(direct.CloseIdleConnections)
	b.Cleanup(viaProxy.CloseIdleConnections)
	get := func(tr *http.Transport, target string) error {
		resp, err := (&http.Client{Transport: tr}).Get(target)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	}
	d, p, ratio := interleave(b.N, func(n int, proxied bool) float64 {
		return parallel(b, 8, n, func() error {
			if proxied {
				return get(viaProxy, fmt.Sprintf("http://bench.test:%d/", up.Port()))
			}
			return get(direct, "http://"+up.String()+"/")
		})
	})
	b.ReportMetric(d, "direct-req/s")
	b.ReportMetric(p, "proxied-req/s")
	b.ReportMetric(ratio, "ratio")
}
