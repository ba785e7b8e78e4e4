//go:build linux

package tproxy

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/egresslog"
)

// readWithUrgent reads c until it has want bytes of the stream (to its
// end, if want is negative), taking TCP urgent data (MSG_OOB) out of band
// as a receiver without SO_OOBINLINE does: it returns the stream and, for
// each urgent byte, the byte and its offset in the stream.
func readWithUrgent(t *testing.T, c *net.TCPConn, want int) (stream []byte, urgent map[int]byte) {
	t.Helper()
	urgent = map[int]byte{}
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	c.SetReadDeadline(deadline)
	defer c.SetReadDeadline(time.Time{})
	// The urgent byte to be read (these tests send one at most) has come
	// before the first read: one that came between a read's look at the
	// mark and the read itself, at the read's place in the stream, would
	// be skipped by that read. SIOCINQ counts only the bytes before a
	// mark still ahead.
	require.Eventually(t, func() bool {
		if want >= 0 {
			return unreadBytes(c) >= want || urgentWaits(c)
		}
		return finReceived(c)
	}, 10*time.Second, time.Millisecond, "the bytes to read did not come")
	buf := make([]byte, 64<<10)
	for time.Now().Before(deadline) {
		if want >= 0 && len(stream) >= want {
			return stream, urgent
		}
		var n int
		var rerr error
		var mark bool
		require.NoError(t, rc.Read(func(fd uintptr) bool {
			if at, _ := unix.IoctlGetInt(int(fd), unix.SIOCATMARK); at == 1 {
				var b [1]byte
				m, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_OOB|unix.MSG_DONTWAIT)
				if err == nil && m == 1 {
					urgent[len(stream)] = b[0]
					mark = true
					return true
				}
			}
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			return !errors.Is(rerr, unix.EAGAIN)
		}))
		if mark {
			continue
		}
		require.NoError(t, rerr)
		if n == 0 {
			return stream, urgent
		}
		stream = append(stream, buf[:n]...)
	}
	require.Fail(t, "the stream did not end", "after %q", stream)
	return
}

// finReceived says whether c's peer has ended its side: c's TCP state is
// one that follows a FIN received.
func finReceived(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true // closed: nothing more will come
	}
	var state uint8
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = info.State
		}
	})
	switch state {
	case unix.BPF_TCP_CLOSE_WAIT, unix.BPF_TCP_LAST_ACK, unix.BPF_TCP_CLOSING, unix.BPF_TCP_TIME_WAIT, unix.BPF_TCP_CLOSE:
		return true
	}
	return false
}

// urgentWaits says whether an urgent byte has come to c and waits to
// be read out of band.
func urgentWaits(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var waits bool
	rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_OOB|unix.MSG_PEEK|unix.MSG_DONTWAIT)
		waits = err == nil && n == 1
	})
	return waits
}

// sendUrgent sends b as TCP urgent data on c.
func sendUrgent(t *testing.T, c *net.TCPConn, b byte) {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), []byte{b}, unix.MSG_OOB, nil)
		return !errors.Is(serr, unix.EAGAIN)
	}))
	require.NoError(t, serr)
}

// TestUrgentDataPassesThrough: TCP urgent data (MSG_OOB: telnet's
// interrupt, FTP's abort, a database client's break) reaches the other
// side as urgent data at its place in the stream, and the bytes after it
// follow, whether the stream's end comes with them or later. splice
// stops at the urgent mark and never reads past it: the relay stalled
// there, or took the mark for the end when the stream's end had come,
// and everything after the mark was lost. A connection
// that has carried urgent data stays on the user-space relay; one
// already on the kernel path gets it inline, whole and in order (a
// stream verdict sees no TCP flags).
func TestUrgentDataPassesThrough(t *testing.T) {
	for _, tc := range []struct {
		name         string
		kernel       bool
		urgentFirst  bool // the client's urgent data waits before the relay starts
		inline       bool
		relayedAfter string
	}{
		{name: "spliced", relayedAfter: egresslog.RelaySplice},
		{name: "before a handover", kernel: true, urgentFirst: true, relayedAfter: egresslog.RelaySplice},
		{name: "on the kernel path", kernel: true, inline: true, relayedAfter: egresslog.RelayKernel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kp KernelPath
			moved := make(chan struct{}, 1)
			if tc.kernel {
				sp := signalled(kernelPath(t))
				kp, moved = sp, sp.moved
			}
			app, client := tcpPair(t, 256<<10)
			up, server := tcpPair(t, 256<<10)
			send := func(from *net.TCPConn, end bool) {
				_, err := from.Write([]byte("before"))
				require.NoError(t, err)
				sendUrgent(t, from, '!')
				_, err = from.Write([]byte("after"))
				require.NoError(t, err)
				if end {
					require.NoError(t, from.CloseWrite())
				}
			}
			if tc.urgentFirst {
				send(app, false)
				require.Eventually(t, func() bool { return unreadBytes(client) >= len("before") }, 5*time.Second, time.Millisecond)
			}
			done := runRelay(newRelay(client, up), kp, -1)
			if tc.relayedAfter == egresslog.RelayKernel {
				awaitMoved(t, moved)
			}
			// Up, the end comes after the bytes have; down, with them.
			for _, way := range []struct {
				from, to *net.TCPConn
				endLater bool
			}{{app, server, true}, {server, app, false}} {
				if way.from != app || !tc.urgentFirst {
					send(way.from, !way.endLater)
				}
				want := len("beforeafter")
				if tc.inline {
					want++
				}
				stream, urgent := readWithUrgent(t, way.to, want)
				if way.endLater {
					require.NoError(t, way.from.CloseWrite())
				}
				rest, more := readWithUrgent(t, way.to, -1)
				assert.Empty(t, rest, "after the end")
				assert.Empty(t, more, "after the end")
				if tc.inline {
					assert.Equal(t, "before!after", string(stream))
					assert.Empty(t, urgent)
				} else {
					assert.Equal(t, "beforeafter", string(stream))
					assert.Equal(t, map[int]byte{len("before"): '!'}, urgent)
				}
			}
			select {
			case res := <-done:
				assert.NoError(t, res.err)
				assert.EqualValues(t, len("before!after"), res.up, "bytes up")
				assert.EqualValues(t, len("before!after"), res.down, "bytes down")
				assert.Equal(t, tc.relayedAfter, res.how)
			case <-time.After(10 * time.Second):
				require.Fail(t, "the relay did not end")
			}
		})
	}
}

// urgentWithin polls c for an urgent byte for up to d, reading nothing
// else: a receiver without SO_OOBINLINE is never woken for a lone urgent
// byte (the kernel waits for the byte after it), so it asks.
func urgentWithin(t *testing.T, c *net.TCPConn, d time.Duration) (byte, bool) {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		var b [1]byte
		var got bool
		rc.Control(func(fd uintptr) {
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_OOB|unix.MSG_DONTWAIT)
			got = err == nil && n == 1
		})
		if got {
			return b[0], true
		}
	}
	return 0, false
}

// runRelay runs r with kp, handing over after bytes, and returns where
// its result arrives.
func runRelay(r *relay, kp KernelPath, after int) <-chan relayResult {
	done := make(chan relayResult, 1)
	go func() {
		var res relayResult
		res.up, res.down, res.how, res.err = r.run(kp, after, func() *slog.Logger { return slog.New(slog.DiscardHandler) })
		done <- res
	}()
	return done
}

// relayResult is what relay.run returned.
type relayResult struct {
	up, down int64
	how      string
	err      error
}

// TestLoneUrgentByte: an urgent byte with nothing after it (telnet's
// Synch: the data mark sent urgent, then the client waits for an answer)
// reaches the other side, each way. Read out of band, it never made the
// relay's socket readable, and waited for whatever the sender sent next.
func TestLoneUrgentByte(t *testing.T) {
	for _, down := range []bool{false, true} {
		t.Run(map[bool]string{false: "up", true: "down"}[down], func(t *testing.T) {
			app, client := tcpPair(t, 256<<10)
			up, server := tcpPair(t, 256<<10)
			done := runRelay(newRelay(client, up), nil, 0)
			from, to := app, server
			if down {
				from, to = server, app
			}
			_, err := from.Write([]byte("hello"))
			require.NoError(t, err)
			got, _ := readWithUrgent(t, to, len("hello"))
			require.Equal(t, "hello", string(got))
			sendUrgent(t, from, '!')
			b, ok := urgentWithin(t, to, 5*time.Second)
			assert.True(t, ok, "the urgent byte did not come")
			assert.Equal(t, byte('!'), b)
			app.Close()
			server.Close()
			<-done
		})
	}
}

// TestUrgentAtTheHandoverMark: an urgent byte just before the bytes after
// which the kernel path would take the connection: the relay moves one
// byte past that mark (the urgent byte and the one after it), and took
// that for the stream's end, passing on a half-close; what came after was
// never relayed.
func TestUrgentAtTheHandoverMark(t *testing.T) {
	kp := kernelPath(t)
	const after = 64 << 10
	app, client := tcpPair(t, 1<<20)
	up, server := tcpPair(t, 1<<20)
	_, err := app.Write(bytes.Repeat([]byte("x"), after-1))
	require.NoError(t, err)
	sendUrgent(t, app, '!')
	_, err = app.Write([]byte("after"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return unreadBytes(client) >= after-1 }, 5*time.Second, time.Millisecond)
	done := runRelay(newRelay(client, up), kp, after)
	got, urgent := readWithUrgent(t, server, after-1+len("after"))
	assert.Equal(t, map[int]byte{after - 1: '!'}, urgent)
	assert.Equal(t, "after", string(got[after-1:]))
	_, err = app.Write([]byte("more"))
	require.NoError(t, err)
	require.NoError(t, app.CloseWrite())
	rest, _ := readWithUrgent(t, server, -1)
	assert.Equal(t, "more", string(rest), "bytes after the mark")
	require.NoError(t, server.CloseWrite())
	select {
	case res := <-done:
		assert.NoError(t, res.err)
		assert.EqualValues(t, after-1+len("!after")+len("more"), res.up)
	case <-time.After(10 * time.Second):
		require.Fail(t, "the relay did not end")
	}
}
