package tproxy

import (
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/policy"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClosedSocketIsIdle: a socket that cannot say when it last received
// (closed) is idle without end, so the idle sweep ends its relay.
func TestClosedSocketIsIdle(t *testing.T) {
	ln := listenLoop(t, "127.0.0.1:0")
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	require.Less(t, idleFor(c.(*net.TCPConn)), time.Minute, "a fresh connection")
	c.Close()
	assert.Equal(t, time.Duration(math.MaxInt64), idleFor(c.(*net.TCPConn)))
}

// pipeBytes is what the process's pipes hold, each pipe counted once.
func pipeBytes(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	seen := map[string]bool{}
	total := 0
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "pipe:") || seen[link] {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		if n, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err == nil { // FIONREAD, on a pipe
			seen[link] = true
			total += n
		}
	}
	return total
}

// TestStalledReaderHoldsNoPipe: a relay fills its pipe with no more than
// the destination can take, so connections whose client reads nothing,
// from servers that send without end, leave their bytes in the sockets'
// queues (where TCP counts them, and its window holds the server back),
// not in pipes (255 KiB a connection here, before; up to 1 MiB); and
// every byte still arrives, in order, once the client reads.
func TestStalledReaderHoldsNoPipe(t *testing.T) {
	const conns = 8
	at := func(off int) byte { return byte(off*7 + off/251) }
	ln := listenLoop(t, "127.0.0.2:0")
	var sent [conns]int               // by client, what its server sent before it was held back
	heldBack := make(chan int, conns) // which client's server was held back
	release := make(chan struct{})    // the servers stay until the clients have read
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		var who [1]byte // the client's first byte: its number
		if _, err := io.ReadFull(c, who[:]); err != nil || int(who[0]) >= conns {
			return
		}
		buf := make([]byte, 256<<10)
		n := 0
		for {
			for i := range buf {
				buf[i] = at(n + i)
			}
			c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
			m, err := c.Write(buf)
			n += m
			if err != nil {
				sent[who[0]] = n
				heldBack <- int(who[0])
				<-release
				return
			}
		}
	})
	defer close(release)
	w := newWorld(t, []string{"svc.test:*"}, nil)
	w.setNames("svc.test")
	clients := make([]net.Conn, conns)
	for i := range clients {
		clients[i] = w.dial(netip.MustParseAddrPort(ln.Addr().String()))
		_, err := clients[i].Write([]byte{byte(i)})
		require.NoError(t, err)
	}
	total := 0
	for range conns {
		select {
		case i := <-heldBack:
			total += sent[i]
		case <-time.After(20 * time.Second):
			require.FailNow(t, "a server was never held back")
		}
	}
	held := pipeBytes(t)
	t.Logf("%d connections whose client reads nothing: pipes hold %d KiB, the servers sent %d KiB", conns, held>>10, total>>10)
	assert.LessOrEqual(t, held, conns*64<<10, "pipes hold what the clients do not take")

	for i, c := range clients {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		b := make([]byte, sent[i])
		_, err := io.ReadFull(c, b)
		require.NoError(t, err, "client %d", i)
		for off, v := range b {
			if v != at(off) {
				require.Failf(t, "bytes out of order", "client %d at offset %d", i, off)
			}
		}
	}
}

// TestScatteredSegmentsKeepTheStreamWhole: the traffic that breaks a
// socket in a sockmap (fastpath.ErrSockmapDefect: a server's one-byte
// segments scattered through its pages, to a client that reads none of
// them, while the client uploads fast) leaves a stream the proxy relays
// whole, every byte in its place.
func TestScatteredSegmentsKeepTheStreamWhole(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open})
	ln := listenLoop(t, "127.0.0.2:0")
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	client := w.dial(addrPortOf(ln.Addr()))
	server := (<-accepted).(*net.TCPConn)
	defer server.Close()
	sinkLn := listenLoop(t, "127.0.0.1:0")
	other, err := net.Dial("tcp", sinkLn.Addr().String())
	require.NoError(t, err)
	defer other.Close()
	sink, err := sinkLn.Accept()
	require.NoError(t, err)
	defer sink.Close()
	go io.Copy(io.Discard, sink)

	rs, err := server.SyscallConn()
	require.NoError(t, err)
	ro, err := other.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	stop, downloaded := make(chan struct{}), make(chan struct{})
	go func() { // never read by the client
		defer close(downloaded)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for n := 0; n < 1<<20; n++ {
			select {
			case <-stop:
				return
			default:
			}
			rs.Write(func(fd uintptr) bool { unix.Write(int(fd), []byte{byte(n)}); return true })
			ro.Write(func(fd uintptr) bool { unix.Write(int(fd), []byte{0}); return true })
		}
	}()
	defer func() { close(stop); <-downloaded }()

	const up = 64 << 20
	word := func(off int) byte { return byte(off>>3) ^ byte(off) }
	go func() {
		buf := make([]byte, 1<<20)
		client.SetWriteDeadline(time.Now().Add(30 * time.Second))
		for sent := 0; sent < up; sent += len(buf) {
			for k := range buf {
				buf[k] = word(sent + k)
			}
			if _, err := client.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	server.SetReadDeadline(time.Now().Add(30 * time.Second))
	for got := 0; got < up; {
		n, err := server.Read(buf)
		for k := range n {
			if buf[k] != word(got+k) {
				require.Failf(t, "a byte out of place", "at offset %d of the upload", got+k)
			}
		}
		got += n
		require.NoError(t, err, "at %d of %d", got, up)
	}
}
