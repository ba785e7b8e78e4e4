//go:build linux

package fastpath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// streamByte is the byte at offset off of a test stream, so that a
// receiver can check every offset.
func streamByte(off int) byte { return byte(off*7 + off/251) }

func streamBytes(from, n int) []byte {
	out := make([]byte, n)
	for k := range out {
		out[k] = streamByte(from + k)
	}
	return out
}

// sendStream writes the stream from offset from to c, up to limit bytes
// or until d passes, and returns what c took.
func sendStream(c *net.TCPConn, from, limit int, d time.Duration) int {
	c.SetWriteDeadline(time.Now().Add(d))
	defer c.SetWriteDeadline(time.Time{})
	sent := 0
	for sent < limit {
		n, err := c.Write(streamBytes(from+sent, min(1<<20, limit-sent)))
		sent += n
		if err != nil {
			break
		}
	}
	return sent
}

// readStream reads n bytes of the stream from offset from, within d, and
// fails at the first byte out of place; it returns what it read.
func readStream(c *net.TCPConn, from, n int, d time.Duration) (int, error) {
	buf := make([]byte, 64<<10)
	c.SetReadDeadline(time.Now().Add(d))
	got := 0
	for got < n {
		k, err := c.Read(buf[:min(len(buf), n-got)])
		for j := range k {
			if buf[j] != streamByte(from+got+j) {
				return got + j, fmt.Errorf("byte out of order at offset %d", from+got+j)
			}
		}
		got += k
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

// sendAndEnd sends n bytes of the stream to c within d, then half-closes
// it, in a goroutine; its error arrives on the channel.
func sendAndEnd(c *net.TCPConn, n int, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		if sent := sendStream(c, 0, n, d); sent < n {
			done <- fmt.Errorf("sent %d of %d", sent, n)
			return
		}
		done <- c.CloseWrite()
	}()
	return done
}

// ranWhole waits up to d for Run to end, and checks that it ended
// without an error, having moved up and down bytes.
func ranWhole(t *testing.T, ran <-chan runResult, up, down int, d time.Duration) {
	t.Helper()
	select {
	case r := <-ran:
		require.NoError(t, r.err)
		assert.EqualValues(t, up, r.up)
		assert.EqualValues(t, down, r.down)
	case <-time.After(d):
		require.Fail(t, "Run did not end")
	}
}

// smallBuffered splices a pair with little room outside the kernel path's
// queue toward the server (64 KiB buffers), and, if towardClient, toward
// the client too, and runs it.
func smallBuffered(t *testing.T, p *Path, towardClient bool) (client, a, b, server *net.TCPConn, pr *Pair, ran <-chan runResult) {
	client, a, b, server = pairUp(t)
	small := []func(int) error{b.SetWriteBuffer, server.SetReadBuffer}
	if towardClient {
		small = append(small, a.SetWriteBuffer, client.SetReadBuffer)
	}
	for _, set := range small {
		require.NoError(t, set(64<<10))
	}
	pr, ran = spliced(t, p, a, b)
	return client, a, b, server, pr, ran
}

// relayedDirection splices a pair whose server reads slowly (small
// buffers) and sends a burst past MaxQueued, so that the client's
// direction is relayed in user space, and returns the pair, its Run's
// result and what the client sent.
func relayedDirection(t *testing.T, p *Path) (client, a, b, server *net.TCPConn, pr *Pair, ran <-chan runResult, sent int) {
	client, a, b, server, pr, ran = smallBuffered(t, p, false)
	sent = sendStream(client, 0, MaxQueued+2<<20, 3*time.Second)
	require.Eventually(t, func() bool { n, _ := pr.unrelayed(0); return pr.relayed[0].Load() > 0 || n > 0 }, 5*time.Second, 10*time.Millisecond,
		"the burst never left the kernel path: the test shows nothing")
	return client, a, b, server, pr, ran, sent
}

// TestResetWhileRelayedInUserSpace: a client that resets while its bytes
// are relayed in user space has the reset passed on, never an end: the
// server must not take a stream cut short for a whole one, and Run
// fails. (A peek that met the reset took it from the socket, and the
// read after it saw an end.)
func TestResetWhileRelayedInUserSpace(t *testing.T) {
	p := newPath(t)
	client, a, b, server, _, ran, sent := relayedDirection(t, p)
	n, err := readStream(server, 0, 1<<20, 5*time.Second)
	require.NoError(t, err, "at %d", n)
	client.SetLinger(0)
	client.Close()

	got := make(chan error, 1)
	go func() {
		_, err := readStream(server, n, sent, 20*time.Second)
		got <- err
	}()
	select {
	case r := <-ran:
		require.Error(t, r.err, "the client's reset")
		// As the socket says it, for the connection's record: no read's
		// wrapping of it.
		assert.Equal(t, "fastpath: "+syscall.ECONNRESET.Error(), r.err.Error())
	case <-time.After(10 * time.Second):
		require.Fail(t, "Run did not end after the client's reset")
	}
	a.Close() // as the caller does after a failure: a reset, both ways
	b.Close()
	err = <-got
	assert.Error(t, err)
	assert.NotErrorIs(t, err, io.EOF, "a stream cut short looked whole")
	assert.False(t, isTimeout(err), "the server was told nothing: %v", err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestAbortWhileRelayWrites: Abort ends Run while a direction relayed in
// user space waits in a write to a server that stopped reading, without
// the caller closing the sockets first.
func TestAbortWhileRelayWrites(t *testing.T) {
	p := newPath(t)
	client, _, b, server, pr, ran, _ := relayedDirection(t, p)
	go sendStream(client, MaxQueued+2<<20, 2*MaxQueued, 20*time.Second)
	// The server takes what was redirected and a little of what is
	// relayed, then stops: the relay's write waits.
	n, err := readStream(server, 0, int(pr.moved(0))+8<<10, 10*time.Second)
	require.NoError(t, err, "at %d", n)
	require.Eventually(t, func() bool {
		q, _, _ := queued(b)
		return q-pr.base[1] >= pr.moved(0)+pr.relayed[0].Load()
	}, 5*time.Second, 10*time.Millisecond, "the relay never wrote")
	time.Sleep(300 * time.Millisecond)

	pr.Abort()
	select {
	case r := <-ran:
		assert.True(t, errors.Is(r.err, ErrAborted), "Run's error: %v", r.err)
	case <-time.After(5 * time.Second):
		assert.Fail(t, "Run did not end after Abort: the relay waits in its write")
	}
}

// TestBytesBehindAStuckReceiver: a client that reads nothing of what it
// is sent (its socket's sends wait in the kernel's backlog) while its own
// bytes are relayed in user space cannot make the kernel hold them
// without end: they wait behind those sends, where nothing charges them
// and TCP's window does not hold the client back. Past maxUnrelayed the
// pair fails, naming the client's side, and the client is held back.
func TestBytesBehindAStuckReceiver(t *testing.T) {
	p := newQueueingPath(t)
	client, a, b, server, pr, ran := smallBuffered(t, p, true)

	// The server sends; the client reads none of it.
	go sendStream(server, 0, 8<<20, 30*time.Second)
	time.Sleep(time.Second)
	// A burst while the server reads nothing: the client's direction
	// leaves the kernel path.
	sent := sendStream(client, 0, MaxQueued+2<<20, 2*time.Second)
	left, _ := pr.unrelayed(0)
	require.Positive(t, left, "the burst never left the kernel path: the test shows nothing")

	// The server reads all it gets; the client sends on.
	go readStream(server, 0, 1<<30, 20*time.Second)
	sending := make(chan int, 1)
	go func() { sending <- sendStream(client, sent, 1<<30, 20*time.Second) }()
	var r runResult
	select {
	case r = <-ran:
	case <-time.After(15 * time.Second):
		require.Fail(t, "the pair was not failed")
	}
	var side *SideError
	require.ErrorAs(t, r.err, &side)
	assert.Equal(t, 0, side.Side, "the side whose bytes overran")
	assert.ErrorIs(t, r.err, ErrOverrun)
	left, _ = pr.unrelayed(0)
	assert.LessOrEqual(t, left, int64(maxUnrelayed())+64<<10, "left to user space past the bound")
	a.Close() // as the caller does after a failure: the client is reset
	b.Close()
	select {
	case <-sending:
	case <-time.After(5 * time.Second):
		assert.Fail(t, "the client is not held back")
	}
}

// TestEndBehindAStuckReceiver: a client that sends a burst (relayed in
// user space) and its end, and reads what it is sent only seconds later,
// gets all of it, and the server all the client sent and its end, as on
// a direct connection: the client's last bytes wait in the kernel's
// backlog behind what is sent to it, not lost, however long past
// endGrace.
func TestEndBehindAStuckReceiver(t *testing.T) {
	p := newPath(t)
	client, _, _, server, _, ran := smallBuffered(t, p, true)

	const down, up = 8 << 20, MaxQueued + 4<<20
	downDone := sendAndEnd(server, down, 30*time.Second)
	time.Sleep(time.Second) // what is sent to the client waits: it reads nothing
	upDone := sendAndEnd(client, up, 30*time.Second)
	time.Sleep(time.Second) // the server is slow at first: the client's direction leaves the kernel path
	serverGot := make(chan error, 1)
	go func() {
		n, err := readStream(server, 0, up, 15*time.Second)
		if err == nil {
			_, err = server.Read(make([]byte, 1))
			if err == io.EOF {
				err = nil
			} else {
				err = fmt.Errorf("after the whole upload, no end: %v", err)
			}
		} else {
			err = fmt.Errorf("at %d of %d: %w", n, up, err)
		}
		serverGot <- err
	}()
	require.NoError(t, <-upDone, "the client's upload")
	time.Sleep(endGrace + 2*time.Second) // the client reads only now
	n, err := readStream(client, 0, down, 10*time.Second)
	assert.NoError(t, err, "what was sent to the client, at %d of %d", n, down)
	assert.NoError(t, <-serverGot, "the server's")
	assert.NoError(t, <-downDone)
	ranWhole(t, ran, up, down, 15*time.Second)
}

// TestBurstsBothWays: both directions burst past MaxQueued to receivers
// that pause, then send at a pace, again and again: each leaves the
// kernel path, and mostly comes back, several times. Every byte arrives
// once, in order, each way; the counts are exact; nothing stays charged.
func TestBurstsBothWays(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	for _, c := range []*net.TCPConn{client, a, b, server} {
		require.NoError(t, c.SetReadBuffer(64<<10))
		require.NoError(t, c.SetWriteBuffer(64<<10))
	}
	pr, ran := spliced(t, p, a, b)

	const cycles, burst, paced, chunk = 3, MaxQueued + 2<<20, 1 << 20, 16 << 10
	const total = cycles * (burst + paced)
	errs := make(chan error, 4)
	for _, ends := range [][2]*net.TCPConn{{client, server}, {server, client}} {
		src, dst := ends[0], ends[1]
		go func() { // the sender
			off := 0
			for range cycles {
				off += sendStream(src, off, burst, 30*time.Second)
				for k := 0; k < paced; k += chunk {
					off += sendStream(src, off, chunk, 5*time.Second)
					time.Sleep(2 * time.Millisecond)
				}
			}
			if off < total {
				errs <- fmt.Errorf("sent %d of %d", off, total)
				return
			}
			errs <- src.CloseWrite()
		}()
		go func() { // the receiver, pausing at each burst
			got := 0
			for range cycles {
				time.Sleep(500 * time.Millisecond)
				n, err := readStream(dst, got, burst+paced, 30*time.Second)
				got += n
				if err != nil {
					errs <- fmt.Errorf("at %d: %w", got, err)
					return
				}
			}
			if _, err := dst.Read(make([]byte, 1)); err != io.EOF {
				errs <- fmt.Errorf("after %d, no end: %v", got, err)
				return
			}
			errs <- nil
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	ranWhole(t, ran, total, total, 10*time.Second)
	// Whether a direction comes back depends on Run catching up between
	// the sender's chunks; most runs here see it more than once.
	t.Logf("moved on the kernel path: %d and %d KiB of %d KiB each way", pr.moved(0)>>10, pr.moved(1)>>10, total>>10)
	pr.Remove()
	assert.Zero(t, p.Queued(), "charged after the pair is done")
}

// TestTinySegmentsBehindAStuckReceiver: what waits behind a receiver that
// takes none is charged by the skb, as what is queued is: one-byte
// segments, each costing the kernel a kilobyte or so, fail the pair
// before its memory grows much (690,000 of them took 300 MiB of slab when
// only their bytes counted).
func TestTinySegmentsBehindAStuckReceiver(t *testing.T) {
	p := newQueueingPath(t)
	client, a, b, server, pr, ran := smallBuffered(t, p, true)
	go sendStream(server, 0, 8<<20, 30*time.Second) // the client reads none of it
	time.Sleep(time.Second)
	sent := sendStream(client, 0, MaxQueued+2<<20, 2*time.Second)
	left, _ := pr.unrelayed(0)
	require.Positive(t, left, "the burst never left the kernel path: the test shows nothing")
	go readStream(server, 0, 1<<30, 20*time.Second)
	time.Sleep(200 * time.Millisecond)

	require.NoError(t, client.SetNoDelay(true))
	var fd int
	require.NoError(t, withFD(client, func(f int) error { fd = f; return nil }))
	before := slab(t)
	failed := false
	for tiny, end := 0, time.Now().Add(20*time.Second); tiny < 1_000_000 && time.Now().Before(end) && !failed; {
		if tiny%10_000 == 0 && slab(t)-before > 200<<20 {
			break // shown: stop before the machine feels it
		}
		n, err := unix.Write(fd, []byte{streamByte(sent + tiny)})
		if err != nil && err != unix.EAGAIN {
			break // reset: the pair failed
		}
		tiny += n
		// Each byte its own segment: the next goes once loopback has
		// delivered this one, so that autocorking does not join them.
		for spin := time.Now(); time.Since(spin) < 10*time.Microsecond; {
		}
		select {
		case r := <-ran:
			var side *SideError
			assert.ErrorAs(t, r.err, &side)
			assert.ErrorIs(t, r.err, ErrOverrun)
			failed = true
		default:
		}
	}
	grown := slab(t) - before
	assert.True(t, failed, "the pair was not failed; the kernel's slab grew %d MiB", grown>>20)
	assert.Less(t, grown, int64(100<<20), "the kernel's slab grew %d MiB", grown>>20)
	client.SetLinger(0)
	client.Close()
	a.Close()
	b.Close()
}

// TestFullDuplexWithASlowReader: a client that uploads far more than any
// bound, as fast as loopback takes it, while it reads its download at a
// few MiB/s, gets both whole, in order, as on a direct connection. Its
// upload outpaces the kernel's redirect and is relayed in part by Run;
// those bytes must not wait behind its slow download, where nothing
// holds the client back and the pair would be failed for it.
func TestFullDuplexWithASlowReader(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	pr, ran := spliced(t, p, a, b)

	const up, down = 256 << 20, 16 << 20
	upDone, downDone := sendAndEnd(client, up, 40*time.Second), sendAndEnd(server, down, 40*time.Second)
	errs := make(chan error, 2)
	go func() { // the server reads all it gets
		n, err := readStream(server, 0, up, 40*time.Second)
		if err != nil {
			err = fmt.Errorf("upload at %d of %d: %w", n, up, err)
		}
		errs <- err
	}()
	go func() { // the client reads its download at about 6 MiB/s
		got := 0
		for got < down {
			n, err := readStream(client, got, min(64<<10, down-got), 40*time.Second)
			got += n
			if err != nil {
				errs <- fmt.Errorf("download at %d of %d: %w", got, down, err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		errs <- nil
	}()
	for _, done := range []<-chan error{upDone, downDone, errs, errs} {
		require.NoError(t, <-done)
	}
	ranWhole(t, ran, up, down, 20*time.Second)
	t.Logf("moved on the kernel path: %d of %d KiB up, %d of %d KiB down", pr.moved(0)>>10, up>>10, pr.moved(1)>>10, down>>10)
}

// TestUploadWhileTheDownloadWaits: a client that reads nothing of what it
// is sent while it uploads far past every bound has its upload carried
// whole, and its download after, once it reads, as on a direct
// connection, and the pair is not failed. What is redirected to the
// client never waits on its send queue, so the client's bytes left to
// user space never wait behind it, where nothing charges them
// (TestBytesBehindAStuckReceiver is that case, met past the send room).
func TestUploadWhileTheDownloadWaits(t *testing.T) {
	p := newPath(t)
	client, _, _, server, _, ran := smallBuffered(t, p, true)

	const up, down = 256 << 20, 8 << 20
	downDone := sendAndEnd(server, down, 40*time.Second)
	time.Sleep(time.Second) // what is sent to the client waits: it reads nothing
	serverGot := make(chan error, 1)
	go func() {
		n, err := readStream(server, 0, up, 30*time.Second)
		if err != nil {
			err = fmt.Errorf("at %d of %d: %w", n, up, err)
		} else if _, err = server.Read(make([]byte, 1)); err == io.EOF {
			err = nil
		}
		serverGot <- err
	}()
	sent := sendStream(client, 0, up, 30*time.Second)
	require.Equal(t, up, sent, "the client's upload stopped")
	require.NoError(t, client.CloseWrite())
	require.NoError(t, <-serverGot, "the server's")
	select {
	case r := <-ran:
		require.Fail(t, "the pair ended while the download waits", "%v", r.err)
	default:
	}

	n, err := readStream(client, 0, down, 10*time.Second)
	require.NoError(t, err, "the download, at %d of %d", n, down)
	_, err = client.Read(make([]byte, 1))
	assert.Equal(t, io.EOF, err, "after the download")
	assert.NoError(t, <-downDone)
	ranWhole(t, ran, up, down, 10*time.Second)
}
