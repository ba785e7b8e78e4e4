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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
)

// BenchmarkHoldConnections holds as many idle proxied connections as the
// open file limit allows the proxy (two descriptors each), with the
// clients in one helper process and the upstream in another, so that the
// proxy's process holds nothing else: its memory per connection is the
// init lets the test binary serve as the helper processes of
// BenchmarkHoldConnections.
func init() {
	if role := os.Getenv("TPROXY_HOLD_ROLE"); role != "" {
		os.Exit(holdHelper(role))
	}
}

// proxy's alone.
func BenchmarkHoldConnections(b *testing.B) {
	var lim syscall.Rlimit
	require.NoError(b, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	lim.Cur = lim.Max
	require.NoError(b, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	n := min(10000, int(lim.Max-64)/2) // what the limit leaves after the process's own
	if n < 1000 {
		b.Skipf("the open file limit (%d) is too low", lim.Max)
	}
	self, err := os.Executable()
	require.NoError(b, err)
	upstream := startHelper(b, self, "upstream", "127.0.0.2:0", n)
	up := netip.MustParseAddrPort(upstream.addr)
	proxy := benchProxy(b, up, nil)

	runtime.GC()
	goBefore, rssBefore := testkit.GoMemory(), testkit.RSS()
	clients := startHelper(b, self, "clients", proxy, n)
	require.NoError(b, clients.wait("held"), "clients")
	require.NoError(b, upstream.wait("held"), "upstream")
	runtime.GC()
	goAfter, rssAfter := testkit.GoMemory(), testkit.RSS()
	b.ReportMetric(float64(n), "connections")
	b.ReportMetric(float64(goAfter-goBefore)/float64(n)/1024, "go-KiB/conn")
	b.ReportMetric(float64(rssAfter-rssBefore)/float64(n)/1024, "rss-KiB/conn")
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
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	addr := os.Getenv("TPROXY_HOLD_ADDR")
	n, _ := strconv.Atoi(os.Getenv("TPROXY_HOLD_N"))
	var held []net.Conn
	switch role {
	case "upstream":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(ln.Addr())
		for len(held) < n {
			c, err := ln.Accept()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			held = append(held, c)
		}
	case "clients":
		fmt.Println(addr)
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			c.Write([]byte("x"))
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
