//go:build linux

package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy/fastpath"
)

// kernelPath is a fastpath.Path for a test, or a skip without the
// privilege.
func kernelPath(t *testing.T) *fastpath.Path {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("the kernel path needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
	kp, err := fastpath.NewDespiteDefect(256)
	require.NoError(t, err)
	t.Cleanup(func() { kp.Close() })
	return kp
}

// signalledPath tells of each connection its KernelPath takes, and of
// each it is told to abort: whether both sockets were still open then,
// so that the counts could be read from them.
type signalledPath struct {
	KernelPath
	moved   chan struct{}
	aborted chan bool
}

func signalled(kp KernelPath) signalledPath {
	return signalledPath{kp, make(chan struct{}, 16), make(chan bool, 16)}
}

func (sp signalledPath) Move(client, upstream *net.TCPConn) (func() (int64, int64, error), func(), error) {
	wait, abort, err := sp.KernelPath.Move(client, upstream)
	if err != nil {
		return wait, abort, err
	}
	sp.moved <- struct{}{}
	return wait, func() {
		sp.aborted <- isOpen(client) && isOpen(upstream)
		abort()
	}, nil
}

// isOpen says whether c has not been closed.
func isOpen(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	return err == nil && rc.Control(func(uintptr) {}) == nil
}

// awaitMoved waits for the kernel path to take a connection.
func awaitMoved(t *testing.T, moved <-chan struct{}) {
	t.Helper()
	select {
	case <-moved:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the kernel path did not take the connection")
	}
}

// echoTransfer sends parts to the echo service through the transparent
// proxy, holding the connection idle for hold after each, half-closes,
// and returns the connection's closing record once the echo, read all
// the while, has come back whole.
func echoTransfer(t *testing.T, w *world, hold time.Duration, parts ...[]byte) egresslog.Record {
	t.Helper()
	c := w.dial(w.echoAddr)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	echoed := make(chan []byte, 1)
	go func() {
		got, err := io.ReadAll(c)
		assert.NoError(t, err) // not the test's goroutine: no FailNow
		echoed <- got
	}()
	for _, part := range parts {
		_, err := c.Write(part)
		require.NoError(t, err)
		time.Sleep(hold)
	}
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	got := <-echoed
	up := bytes.Join(parts, nil)
	require.Equal(t, len("echo:")+len(up), len(got), "kernel path: %v", w.proxy.KernelPath != nil)
	assert.Equal(t, up, got[len("echo:"):], "the echo differs")
	return w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && !r.Open })
}

// bannerExchange reads the banner service's greeting on c, sends a line
// and reads the answer, and returns the
// connection's closing record, of kind.
func bannerExchange(t *testing.T, w *world, c net.Conn, br *bufio.Reader, kind egresslog.Kind, moved <-chan struct{}) egresslog.Record {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "SSH-2.0-test_banner\r\n", line)
	if moved != nil {
		// The service answers and closes, and a connection already ended
		// cannot join the kernel path: it joins first.
		awaitMoved(t, moved)
	}
	_, err = c.Write([]byte("hello\n"))
	require.NoError(t, err)
	line, err = br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "got hello\n", line)
	open := w.log.OpenConns("a1")
	require.Len(t, open, 1)
	c.Close()
	r := w.waitRecord(func(r egresslog.Record) bool { return r.ConnID == open[0].ConnID && !r.Open })
	assert.Equal(t, kind, r.Kind)
	assert.EqualValues(t, len("hello\n"), r.BytesUp, "record %+v", r)
	assert.EqualValues(t, len("SSH-2.0-test_banner\r\ngot hello\n"), r.BytesDown, "record %+v", r)
	return r
}

// TestKernelPathRecordsAsUserSpace: the same transfer, moved by the
// kernel path and by the user-space relay, leaves the same record but
// for how it was moved: bytes each way, close reason, and a duration
// that covers the connection's life.
func TestKernelPathRecordsAsUserSpace(t *testing.T) {
	kp := kernelPath(t)
	// 3 MiB stays within the kernel path's queue; 40 MiB, sent once the
	// connection is on the path, passes it: its directions leave the path
	// and come back.
	for _, size := range []int{3<<20 + 17, 40<<20 + 17} {
		up := make([]byte, size)
		rand.Read(up)
		parts := [][]byte{up}
		if size > fastpath.MaxQueued {
			parts = [][]byte{up[:256<<10], up[256<<10:]}
		}
		const hold = 300 * time.Millisecond
		records := map[string]egresslog.Record{}
		for name, path := range map[string]KernelPath{"user": nil, "kernel": kp} {
			w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.KernelPath = path })
			w.setNames("svc.test")
			records[name] = echoTransfer(t, w, hold, parts...)
		}
		user, kernel := records["user"], records["kernel"]
		assert.Equal(t, egresslog.RelaySplice, user.Relay)
		assert.Equal(t, egresslog.RelayKernel, kernel.Relay)
		assert.EqualValues(t, len(up), kernel.BytesUp, "%d bytes", size)
		assert.Equal(t, user.BytesUp, kernel.BytesUp, "bytes up")
		assert.Equal(t, user.BytesDown, kernel.BytesDown, "bytes down")
		assert.Equal(t, user.Reason, kernel.Reason, "close reason")
		assert.Equal(t, policy.ReasonAllowedByRule, kernel.Reason, "an end without an error")
		for name, r := range records {
			assert.GreaterOrEqual(t, r.Duration, hold, "%s: the duration misses the connection's life", name)
			assert.Less(t, r.Duration, hold+10*time.Second, "%s: the duration outlasts the connection", name)
		}
	}
}

// TestKernelPathResetReason: a connection its upstream resets leaves
// the same close reason on the kernel path as on the user-space relay:
// the direction whose source failed, and why. The kernel path said only
// that it failed.
func TestKernelPathResetReason(t *testing.T) {
	kp := kernelPath(t)
	reasons := map[string]string{}
	for _, name := range []string{"user", "kernel"} {
		var sp signalledPath
		w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) {
			if name == "kernel" {
				sp = signalled(kp)
				p.KernelPath, p.KernelPathAfter = sp, -1
			}
		})
		w.setNames("svc.test")
		ln := listenLoop(t, "127.0.0.2:0")
		go acceptLoop(ln, func(c net.Conn) {
			defer c.Close()
			io.WriteString(c, "hi\n")
			io.ReadFull(c, make([]byte, 2))
			c.(*net.TCPConn).SetLinger(0) // closed with a reset
		})
		c := w.dial(addrPortOf(ln.Addr()))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadFull(c, make([]byte, 3))
		require.NoError(t, err)
		if name == "kernel" {
			awaitMoved(t, sp.moved)
		}
		io.WriteString(c, "x\n")
		_, err = c.Read(make([]byte, 1))
		require.Error(t, err, "%s: not reset", name)
		r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && !r.Open })
		assert.Equal(t, map[string]string{"user": egresslog.RelaySplice, "kernel": egresslog.RelayKernel}[name], r.Relay, "%s: record %+v", name, r)
		reasons[name] = r.Reason
	}
	assert.Equal(t, "upstream->client: connection reset by peer", reasons["user"])
	assert.Equal(t, reasons["user"], reasons["kernel"], "the close reason of a reset differs by path")
}

// TestKernelPathOnlyWhereSafe: TLS passed through and CONNECT tunnels go
// on the kernel path; a byte-rate quota keeps an agent's connections on
// the user-space relay, held to pace. (Handed over at once: these
// exchanges are short.)
func TestKernelPathOnlyWhereSafe(t *testing.T) {
	kp := kernelPath(t)
	sp := signalled(kp)
	w := newWorld(t, []string{"svc.test:*", "api.test:*"}, func(p *Proxy) { p.KernelPath, p.KernelPathAfter = sp, -1 })
	w.setNames("svc.test")
	body, err := w.httpsGet(w.tlsAddr, "api.test")
	require.NoError(t, err)
	assert.Contains(t, body, w.tlsAddr.String())
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTLS && !r.Open })
	assert.Equal(t, egresslog.RelayKernel, r.Relay, "TLS passed through: %+v", r)
	assert.Positive(t, r.BytesUp)
	assert.Positive(t, r.BytesDown)

	c, br, resp := w.connectTo(fmt.Sprintf("svc.test:%d", w.bannerAddr.Port()))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	awaitMoved(t, sp.moved) // the TLS connection
	r = bannerExchange(t, w, c, br, egresslog.KindConnect, sp.moved)
	assert.Equal(t, egresslog.RelayKernel, r.Relay, "a CONNECT tunnel passed through: %+v", r)

	// Said and half-closed at once: on whichever path takes it, whole.
	r = echoTransfer(t, w, 0, []byte("said and done"))
	assert.EqualValues(t, len("said and done"), r.BytesUp, "record %+v", r)
	assert.EqualValues(t, len("echo:said and done"), r.BytesDown, "record %+v", r)

	w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"svc.test:*"},
		Quotas: policy.Quotas{BytesPerSecondUp: 1 << 30, BytesPerSecondDown: 1 << 30}})
	c = w.dial(w.bannerAddr)
	r = bannerExchange(t, w, c, bufio.NewReader(c), egresslog.KindTCP, nil)
	assert.Equal(t, egresslog.RelaySplice, r.Relay, "a paced connection left the user-space relay: %+v", r)
}

// TestKernelPathOnlyAfterFirstBytes: a connection moves to the kernel
// path only once one direction has moved KernelPathAfter bytes, both
// still open; a short exchange, and one whose other direction ended
// first, stay on the user-space relay. Each moves every byte, once.
func TestKernelPathOnlyAfterFirstBytes(t *testing.T) {
	kp := kernelPath(t)
	up := make([]byte, 200<<10)
	rand.Read(up)
	for _, tc := range []struct {
		name  string
		after int
		relay string
	}{
		{"up passes the mark, down still open", 64 << 10, egresslog.RelayKernel},
		{"up ends short of it, then down passes it", len(up) + 1, egresslog.RelaySplice},
		{"neither reaches it", len(up) + len("echo:") + 1, egresslog.RelaySplice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := signalled(kp)
			w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.KernelPath, p.KernelPathAfter = sp, tc.after })
			w.setNames("svc.test")
			// Held open a moment: a side that has ended cannot join the
			// kernel path, and the echo service answers only at the end.
			r := echoTransfer(t, w, 50*time.Millisecond, up)
			assert.Equal(t, tc.relay, r.Relay, "record %+v", r)
			assert.Equal(t, tc.relay == egresslog.RelayKernel, len(sp.moved) == 1, "moves")
			assert.EqualValues(t, len(up), r.BytesUp, "record %+v", r)
			assert.EqualValues(t, len("echo:")+len(up), r.BytesDown, "record %+v", r)
		})
	}

	sp := signalled(kp)
	w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.KernelPath = sp })
	w.setNames("svc.test")

	// Handed over while bytes flow both ways at once: a mirror sends back
	// what it reads as it reads it, from a client that pauses between its
	// writes; every byte arrives, in order. (A client that never pauses
	// meets the kernel's defect now and then: BenchmarkTwoWayFloods.)
	mirror := w.dial(serveMirror(t))
	sent := make([]byte, 8<<20)
	rand.Read(sent)
	go func() {
		for b := sent; len(b) > 0; b = b[min(len(b), 64<<10):] {
			if _, err := mirror.Write(b[:min(len(b), 64<<10)]); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
		mirror.(*net.TCPConn).CloseWrite()
	}()
	mirror.SetReadDeadline(time.Now().Add(20 * time.Second))
	back, err := io.ReadAll(mirror)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(sent, back), "the mirror's %d bytes differ from the %d sent", len(back), len(sent))
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && !r.Open })
	assert.Equal(t, egresslog.RelayKernel, r.Relay, "record %+v", r)
	awaitMoved(t, sp.moved)
	assert.EqualValues(t, len(sent), r.BytesUp, "record %+v", r)
	assert.EqualValues(t, len(sent), r.BytesDown, "record %+v", r)
	mirror.Close()

	c := w.dial(w.bannerAddr)
	r = bannerExchange(t, w, c, bufio.NewReader(c), egresslog.KindTCP, nil)
	assert.Equal(t, egresslog.RelaySplice, r.Relay, "a short exchange was moved: %+v", r)
	assert.Empty(t, sp.moved)
}

// TestKernelPathEndsOnForgetAndRejudge: a connection on the kernel path
// ends when its agent is forgotten, and when a policy change refuses its
// destination, with the record the user-space relay would leave.
func TestKernelPathEndsOnForgetAndRejudge(t *testing.T) {
	kp := kernelPath(t)
	reasons := map[string]string{} // of a forgotten agent's connection
	for name, sp := range map[string]*signalledPath{"user": nil, "kernel": ptr(signalled(kp))} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) {
				if sp != nil {
					p.KernelPath, p.KernelPathAfter = sp, -1 // a banner is short
				}
			})
			w.setNames("svc.test")
			open := func() (net.Conn, *bufio.Reader, uint64) {
				c := w.dial(w.bannerAddr)
				br := bufio.NewReader(c)
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				line, err := br.ReadString('\n')
				require.NoError(t, err, "banner")
				require.Equal(t, "SSH-2.0-test_banner\r\n", line)
				require.Eventually(t, func() bool { return len(w.log.OpenConns("a1")) == 1 }, 5*time.Second, 10*time.Millisecond)
				if sp != nil {
					awaitMoved(t, sp.moved)
				}
				return c, br, w.log.OpenConns("a1")[0].ConnID
			}
			ended := func(br *bufio.Reader, id uint64) egresslog.Record {
				_, err := br.ReadString('\n')
				assert.Error(t, err, "the connection is still open")
				if sp != nil {
					select {
					case open := <-sp.aborted:
						assert.True(t, open, "the kernel path was told to abort after its sockets were closed: its counts are lost")
					default:
						assert.Fail(t, "the kernel path was not told to abort")
					}
				}
				return w.waitRecord(func(r egresslog.Record) bool { return r.ConnID == id && !r.Open })
			}

			c, br, id := open()
			w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*"}})
			w.proxy.Rejudge("a1")
			r := ended(br, id)
			assert.Equal(t, ReasonPolicyChanged+policy.ReasonNoRule, r.Reason, "record %+v", r)
			assert.Equal(t, name == "kernel", r.Relay == egresslog.RelayKernel, "record %+v", r)
			c.Close()

			w.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"svc.test:*"}})
			c, br, id = open()
			w.proxy.Forget("a1")
			r = ended(br, id)
			reasons[name] = r.Reason
			c.Close()
		})
	}
	for name, why := range reasons {
		assert.Equal(t, ReasonForgotten, why, "%s: a forgotten agent's connection ended otherwise", name)
	}
}

func ptr[T any](v T) *T { return &v }

// tcpPair returns the two ends of a loopback TCP connection, with
// socket buffers of size bytes each way on both (which also turns off
// the kernel's tuning of them).
func tcpPair(t *testing.T, size int) (dialled, accepted *net.TCPConn) {
	t.Helper()
	// Segments of an Ethernet's size: with loopback's (64 KiB), a
	// receive window smaller than one segment stalls TCP itself, whatever
	// the relay does (the sender waits on its persist timer, backing off).
	ethernetSegments := func(_, _ string, rc syscall.RawConn) error {
		var err error
		rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, 1448) })
		return err
	}
	l, err := (&net.ListenConfig{Control: ethernetSegments}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := l
	t.Cleanup(func() { ln.Close() })
	c, err := (&net.Dialer{Control: ethernetSegments}).Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); s.Close() })
	for _, tc := range []*net.TCPConn{c.(*net.TCPConn), s.(*net.TCPConn)} {
		require.NoError(t, tc.SetReadBuffer(size))
		require.NoError(t, tc.SetWriteBuffer(size))
	}
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestHandoverWhileAMirrorWaitsOnItsWrites: a handover must not stop a
// direction while the other still moves bytes that need it. The upstream
// mirrors what it reads (io.Copy(c, c)): it reads again only once its
// write went through. A direction that had stopped reading to wait for
// the other left the other blocked writing to the mirror, and the
// connection stalled until the idle timeout. Handed over at once with
// more of the client's bytes queued than the mirror's side holds (16 KiB
// buffers), the stall was certain; after the first 64 KiB, possible.
// Every byte arrives, in order, whether or not the kernel path takes the
// connection, and the counts say so.
func TestHandoverWhileAMirrorWaitsOnItsWrites(t *testing.T) {
	kp := kernelPath(t)
	for _, tc := range []struct {
		name   string
		after  int64
		queued int // the client's bytes waiting before the relay starts
	}{
		{"at once, bytes queued", -1, 1 << 20},
		{"after 64 KiB", 64 << 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app, client := tcpPair(t, 4<<20)
			up, mirror := tcpPair(t, 16<<10)
			go func() {
				io.Copy(mirror, mirror)
				mirror.CloseWrite()
			}()
			sent := make([]byte, 8<<20)
			rand.Read(sent)
			go func() {
				app.Write(sent)
				app.CloseWrite()
			}()
			require.Eventually(t, func() bool { return unreadBytes(client) >= tc.queued }, 5*time.Second, time.Millisecond)

			done := runRelay(newRelay(client, up), kp, int(tc.after))
			app.SetReadDeadline(time.Now().Add(20 * time.Second))
			back, err := io.ReadAll(app)
			require.NoError(t, err, "the connection stalled after %d of %d bytes", len(back), len(sent))
			assert.True(t, bytes.Equal(sent, back), "the mirror's %d bytes differ from the %d sent", len(back), len(sent))
			select {
			case res := <-done:
				t.Logf("moved by %s", res.how)
				assert.NoError(t, res.err)
				assert.EqualValues(t, len(sent), res.up, "bytes up (%s)", res.how)
				assert.EqualValues(t, len(sent), res.down, "bytes down (%s)", res.how)
			case <-time.After(10 * time.Second):
				require.Fail(t, "the relay did not end")
			}
		})
	}
}

// unreadBytes is how many bytes wait in c's receive queue.
func unreadBytes(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n
}

// TestKernelPathPerAgent: an agent holds at most KernelPathPerAgent
// connections on the kernel path at once, so that its connections cannot
// take all of what the path may queue; one past it stays on the
// user-space relay, whole, and a place given back is taken again.
func TestKernelPathPerAgent(t *testing.T) {
	sp := signalled(kernelPath(t))
	w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) {
		p.KernelPath, p.KernelPathAfter, p.KernelPathPerAgent = sp, -1, 1
	})
	w.setNames("svc.test")
	greeted := func() (net.Conn, *bufio.Reader) {
		c := w.dial(w.bannerAddr)
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "SSH-2.0-test_banner\r\n", line)
		return c, br
	}
	// exchange sends a line and reads the answer, closes, and returns
	// the connection's record.
	exchange := func(c net.Conn, br *bufio.Reader, relay string) egresslog.Record {
		_, err := c.Write([]byte("hello\n"))
		require.NoError(t, err)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "got hello\n", line)
		c.Close()
		return w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && !r.Open && r.Relay == relay })
	}
	first, firstBr := greeted()
	awaitMoved(t, sp.moved)
	second, secondBr := greeted()
	r := exchange(second, secondBr, egresslog.RelaySplice) // past the agent's one place
	assert.EqualValues(t, len("SSH-2.0-test_banner\r\ngot hello\n"), r.BytesDown)
	assert.Empty(t, sp.moved, "the second connection went on the kernel path")

	r = exchange(first, firstBr, egresslog.RelayKernel)
	assert.EqualValues(t, len("hello\n"), r.BytesUp)

	third, _ := greeted()
	awaitMoved(t, sp.moved) // the first's place, given back
	third.Close()
}

// noAbortPath is a KernelPath that gives no abort: the proxy's resets
// alone end its connections.
type noAbortPath struct{ signalledPath }

func (np noAbortPath) Move(client, upstream *net.TCPConn) (func() (int64, int64, error), func(), error) {
	wait, _, err := np.signalledPath.Move(client, upstream)
	return wait, nil, err
}

// TestKernelPathWithoutAbort: a KernelPath that gives no abort still has
// its connections ended when their agent is forgotten.
func TestKernelPathWithoutAbort(t *testing.T) {
	np := noAbortPath{signalled(kernelPath(t))}
	w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.KernelPath, p.KernelPathAfter = np, -1 })
	br := greetedOnKernelPath(t, w, np.moved)
	require.Eventually(t, func() bool { return len(w.log.OpenConns("a1")) == 1 }, 5*time.Second, 10*time.Millisecond)
	id := w.log.OpenConns("a1")[0].ConnID

	w.proxy.Forget("a1")
	_, err := br.ReadString('\n')
	assert.Error(t, err, "the connection is still open")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.ConnID == id && !r.Open })
	assert.Equal(t, ReasonForgotten, r.Reason)
}

// greetedOnKernelPath dials the banner service for svc.test through w's
// proxy, reads its greeting, and waits for the kernel path to take the
// connection (moved); it returns the connection's reader.
func greetedOnKernelPath(t *testing.T, w *world, moved <-chan struct{}) *bufio.Reader {
	t.Helper()
	w.setNames("svc.test")
	c := w.dial(w.bannerAddr)
	t.Cleanup(func() { c.Close() })
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := br.ReadString('\n')
	require.NoError(t, err, "banner")
	awaitMoved(t, moved)
	return br
}

// duringMovePath is a KernelPath that calls during after it has taken a
// connection, before it answers the proxy.
type duringMovePath struct {
	signalledPath
	during func()
}

func (dp duringMovePath) Move(client, upstream *net.TCPConn) (func() (int64, int64, error), func(), error) {
	wait, abort, err := dp.signalledPath.Move(client, upstream)
	if err == nil {
		dp.during()
	}
	return wait, abort, err
}

// TestForgetDuringHandover: an agent forgotten while its connection is
// being handed to the kernel path has it ended there, through the kernel
// path's abort while both sockets are open (so its counts are read), and
// recorded as forgotten; not closed beneath the kernel path unseen.
func TestForgetDuringHandover(t *testing.T) {
	var w *world
	dp := duringMovePath{signalledPath: signalled(kernelPath(t))}
	dp.during = func() {
		go w.proxy.Forget("a1")
		time.Sleep(100 * time.Millisecond) // the Forget comes while the kernel path answers
	}
	w = newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.KernelPath, p.KernelPathAfter = dp, -1 })
	br := greetedOnKernelPath(t, w, dp.moved)

	_, err := br.ReadString('\n')
	assert.Error(t, err, "the connection is still open")
	select {
	case open := <-dp.aborted:
		assert.True(t, open, "the kernel path was told to abort after its sockets were closed: its counts are lost")
	case <-time.After(5 * time.Second):
		assert.Fail(t, "the kernel path was not told to abort")
	}
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && !r.Open })
	assert.Equal(t, ReasonForgotten, r.Reason, "record %+v", r)
	assert.Equal(t, egresslog.RelayKernel, r.Relay, "record %+v", r)
	assert.EqualValues(t, len("SSH-2.0-test_banner\r\n"), r.BytesDown, "record %+v", r)
}

// racePath is a KernelPath that takes a connection whose sockets are
// both open at Move, noting whether the relay's abort had begun then and
// whether the abort it gave was called.
type racePath struct {
	r                         *relay
	took, abortBegun, stopped atomic.Bool
}

func (rp *racePath) Move(client, upstream *net.TCPConn) (func() (int64, int64, error), func(), error) {
	rp.abortBegun.Store(rp.r.why.Load() != nil)
	if !isOpen(client) || !isOpen(upstream) {
		return nil, nil, net.ErrClosed
	}
	rp.took.Store(true)
	return func() (int64, int64, error) { return 0, 0, nil }, func() { rp.stopped.Store(true) }, nil
}

// TestAbortRacingTheHandover: an abort and a handover at once, many
// times: either the handover finds the sockets closed, or the kernel path
// that took them is told to abort. An abort that had begun but not yet
// closed the sockets once let the kernel path take them and never told
// it, and its counts were not fixed.
func TestAbortRacingTheHandover(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer ln.Close()
	missed := 0
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 3000 && time.Now().Before(deadline); i++ {
		var conns []*net.TCPConn
		for range 2 {
			c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
			require.NoError(t, err)
			s, err := ln.AcceptTCP()
			require.NoError(t, err)
			conns = append(conns, c, s)
		}
		r := newRelay(conns[1], conns[2])
		rp := &racePath{r: r}
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-start; r.abort("policy changed") })
		wg.Go(func() { <-start; r.handOver(rp) })
		close(start)
		wg.Wait()
		if rp.took.Load() && !rp.stopped.Load() {
			missed++
		}
		for _, c := range conns {
			c.Close()
		}
	}
	assert.Zero(t, missed, "times the kernel path took the sockets and was never told to abort")
}

// serveMirror runs an upstream on 127.0.0.2 that sends back what it
// reads as it reads it, and passes the client's end on.
func serveMirror(tb testing.TB) netip.AddrPort {
	ln := listenLoop(tb, "127.0.0.2:0")
	go acceptLoop(ln, func(c net.Conn) {
		defer c.Close()
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}
