//go:build linux

package tproxy

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
)

// init lets the test binary serve as the helper processes of
// BenchmarkHoldConnections.
func init() {
	if role := os.Getenv("TPROXY_HOLD_ROLE"); role != "" {
		os.Exit(holdHelper(role))
	}
}

// holdAddrs is how many loopback addresses the clients connect from and
// the upstream listens on: each pair of addresses gives one port range's
// worth of connections.
const holdAddrs = 4

// BenchmarkHoldConnections holds b.N idle proxied connections (up to what
// the open file limit allows, two descriptors each; as root the limit is
// raised), with the clients in one helper process and the upstream in
// another, so that the proxy's process holds nothing else: its memory
// per connection is the proxy's alone. It holds them on the splicing
// relay, and, as root, on the kernel path.
//
//	go test -run X -bench '^BenchmarkHoldConnections$' -benchtime 50000x ./tproxy
func BenchmarkHoldConnections(b *testing.B) {
	self, err := os.Executable()
	require.NoError(b, err)
	hold := func(b *testing.B, kernel KernelPath) {
		n := b.N
		if err := raiseFileLimit(uint64(2*n + 1024)); err != nil {
			b.Logf("open file limit: %v", err)
		}
		var lim syscall.Rlimit
		require.NoError(b, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
		if int(lim.Cur-256)/2 < n { // what the limit leaves after the process's own
			b.Skipf("the open file limit (%d) is too low for %d connections", lim.Cur, n)
		}
		upstream := startHelper(b, self, "upstream", "127.0.0.2:0", n)
		up := netip.MustParseAddrPort(upstream.addr)
		var next atomic.Uint32
		proxy := benchProxy(b, up, withKernelPath(kernel), func(p *Proxy) {
			p.KernelPathAfter = -1 // an idle connection moves no bytes: at once
			// The upstream's addresses in turn.
			p.OriginalDst = func(*net.TCPConn) (netip.AddrPort, error) {
				a := up.Addr().As4()
				a[3] += byte(next.Add(1) % holdAddrs)
				return netip.AddrPortFrom(netip.AddrFrom4(a), up.Port()), nil
			}
		})
		debug.FreeOSMemory() // a collection, and what it freed returned, as the scavenger does in time
		goBefore, rssBefore := testkit.GoMemory(), testkit.RSS()
		clients := startHelper(b, self, "clients", proxy, n)
		require.NoError(b, clients.wait("held"), "clients")
		require.NoError(b, upstream.wait("held"), "upstream")
		debug.FreeOSMemory() // a collection, and what it freed returned, as the scavenger does in time
		goAfter, rssAfter := testkit.GoMemory(), testkit.RSS()
		b.ReportMetric(float64(n), "connections")
		b.ReportMetric(float64(goAfter-goBefore)/float64(n)/1024, "go-KiB/conn")
		b.ReportMetric(float64(rssAfter-rssBefore)/float64(n)/1024, "rss-KiB/conn")
		b.ReportMetric(float64(rssAfter)/(1<<20), "rss-MiB")
		b.ReportMetric(float64(runtime.NumGoroutine())/float64(n), "goroutines/conn")
	}
	b.Run("splice", func(b *testing.B) { hold(b, nil) })
	if kp := benchKernelPath(b); kp != nil {
		b.Run("kernel", func(b *testing.B) { hold(b, kp) })
	}
}

// helper is a helper process that prints its address, then "held".
type helper struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
	addr  string
}

func startHelper(b *testing.B, self, role, addr string, n int) *helper {
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "TPROXY_HOLD_ROLE="+role, "TPROXY_HOLD_ADDR="+addr, "TPROXY_HOLD_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	h := &helper{cmd: cmd, lines: bufio.NewScanner(out)}
	require.True(b, h.lines.Scan(), "%s helper exited", role)
	h.addr = h.lines.Text()
	return h
}

func (h *helper) wait(word string) error {
	done := make(chan error, 1)
	go func() {
		for h.lines.Scan() {
			if strings.HasPrefix(h.lines.Text(), word) {
				done <- nil
				return
			}
		}
		done <- fmt.Errorf("exited before %q", word)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("no %q in 2 minutes", word)
	}
}

// holdHelper is the body of a helper process: "upstream" accepts n
// connections and holds them; "clients" opens n connections to the proxy,
// sends a byte on each, and holds them. Each prints its address first
// and "held" when it holds all n, then waits to be killed.
func holdHelper(role string) int {
	addr := os.Getenv("TPROXY_HOLD_ADDR")
	n, _ := strconv.Atoi(os.Getenv("TPROXY_HOLD_N"))
	lim := syscall.Rlimit{Cur: uint64(n + 256), Max: uint64(n + 256)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	var held []net.Conn
	switch role {
	case "upstream":
		// The same port on holdAddrs addresses (127.0.0.2 and on), which
		// the proxy dials in turn.
		first, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(first.Addr())
		port := first.Addr().(*net.TCPAddr).Port
		accepted := make(chan net.Conn)
		for i := range holdAddrs {
			ln := first
			if i > 0 {
				if ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", 2+i, port)); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
			}
			go acceptLoop(ln, func(c net.Conn) { accepted <- c })
		}
		for len(held) < n {
			held = append(held, <-accepted)
		}
	case "clients":
		fmt.Println(addr)
		for i := range n {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i%holdAddrs))}}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			c.Write([]byte("x\n"))
			held = append(held, c)
		}
	default:
		return 2
	}
	fmt.Println("held", len(held))
	for {
		time.Sleep(time.Hour) // holding them until killed
	}
}
