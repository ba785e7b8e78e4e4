//go:build linux

package fastpath

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// pairUp connects a client to a proxy side (a) and the proxy to a server
// (b), all on loopback, and returns client, a, b, server.
func pairUp(t testing.TB) (client, a, b, server *net.TCPConn) {
	proxyLn, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer proxyLn.Close()
	serverLn, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer serverLn.Close()
	client, err = net.DialTCP("tcp", nil, proxyLn.Addr().(*net.TCPAddr))
	require.NoError(t, err)
	a, err = proxyLn.AcceptTCP()
	require.NoError(t, err)
	b, err = net.DialTCP("tcp", nil, serverLn.Addr().(*net.TCPAddr))
	require.NoError(t, err)
	server, err = serverLn.AcceptTCP()
	require.NoError(t, err)
	for _, c := range []*net.TCPConn{client, a, b, server} {
		t.Cleanup(func() { c.Close() })
	}
	return
}

// runResult is what Run returned.
type runResult struct {
	up, down int64
	err      error
}

// runInBackground runs pr.Run(a, b) and returns where its result arrives.
func runInBackground(pr *Pair, a, b *net.TCPConn) <-chan runResult {
	ran := make(chan runResult, 1)
	go func() {
		up, down, err := pr.Run(a, b)
		ran <- runResult{up, down, err}
	}()
	return ran
}

// spliced splices a and b on p, removes the pair at the test's end, and
// runs it.
func spliced(t testing.TB, p *Path, a, b *net.TCPConn) (*Pair, <-chan runResult) {
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	t.Cleanup(pr.Remove)
	return pr, runInBackground(pr, a, b)
}

func newPath(t testing.TB) *Path { return loadPath(t, true) }

// newQueueingPath is a Path whose verdict redirects past the room in the
// peer's send queue, so that bytes wait on the kernel path for a
// receiver that reads nothing, as they do when TCP, short of memory,
// does not take what there was room for: where MaxQueued, the total and
// the overrun bound are met.
func newQueueingPath(t testing.TB) *Path { return loadPath(t, false) }

func loadPath(t testing.TB, sendRoom bool) *Path {
	if os.Getuid() != 0 {
		t.Skip("the kernel path needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
	p, err := load(64, sendRoom)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// TestBytesMoveInTheKernel: what the client sends reaches the server and
// back, whole and in order, with nothing read by the proxy, and the
// counts say how much went each way.
func TestBytesMoveInTheKernel(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	defer pr.Remove()

	up := make([]byte, MaxQueued/2) // less than the verdict may queue: no Run needed
	rand.Read(up)
	down := make([]byte, 1<<20)
	rand.Read(down)
	go func() { client.Write(up) }()
	got := make([]byte, len(up))
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(server, got)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(up, got), "the server got other bytes")
	go func() { server.Write(down) }()
	got = make([]byte, len(down))
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(client, got)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(down, got), "the client got other bytes")
	aToB, bToA := pr.Bytes()
	assert.EqualValues(t, len(up), aToB)
	assert.EqualValues(t, len(down), bToA)

	// The end of the client's stream: the proxy side sees it.
	require.NoError(t, client.CloseWrite())
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := a.Read(make([]byte, 16))
	assert.Equal(t, 0, n)
	assert.ErrorIs(t, err, io.EOF, "the proxy does not see the client's end")
}

// TestRunPassesEndsOn: each side's end of stream reaches the other after
// every byte before it, and Run returns the counts; the same transfer
// many times, so that an end that overtook its bytes would show.
func TestRunPassesEndsOn(t *testing.T) {
	p := newPath(t)
	for round := range 20 {
		client, a, b, server := pairUp(t)
		written := []byte("first bytes the proxy read and sent itself\n")
		_, err := b.Write(written)
		require.NoError(t, err)
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		done := runInBackground(pr, a, b)
		up := make([]byte, 256<<10+round)
		rand.Read(up)
		go func() { client.Write(up); client.CloseWrite() }()
		got, err := io.ReadAll(server)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, len(written)+len(up), len(got), "round %d: the end overtook bytes", round)
		assert.True(t, bytes.Equal(up, got[len(written):]), "round %d", round)
		server.Write([]byte("answer"))
		server.CloseWrite()
		back, err := io.ReadAll(client)
		require.NoError(t, err)
		assert.Equal(t, "answer", string(back))
		r := <-done
		require.NoError(t, r.err)
		assert.EqualValues(t, len(up), r.up)
		assert.EqualValues(t, len("answer"), r.down)
		pr.Remove()
	}
}

// BenchmarkBulk moves b.N bytes (at least 64 MiB) one way on loopback,
// directly, through the kernel
// path, and through a relay that splices (io.Copy between two TCP
// connections), interleaved in rounds, and reports each rate and the
// kernel path's ratio to direct and to the relay.
func BenchmarkBulk(b *testing.B) {
	p := newPath(b)
	chunk := make([]byte, 256<<10)
	send := func(client, server *net.TCPConn, n int) float64 {
		done := make(chan struct{})
		go func() {
			io.CopyN(io.Discard, server, int64(n))
			close(done)
		}()
		start := time.Now()
		for sent := 0; sent < n; sent += len(chunk) {
			client.Write(chunk[:min(len(chunk), n-sent)])
		}
		<-done
		return float64(n) / time.Since(start).Seconds() / (1 << 20)
	}
	direct := func(n int) float64 {
		_, _, bb, server := pairUp(b) // the proxy's upstream socket is a client of the server
		return send(bb, server, n)
	}
	kernel := func(n int) float64 {
		client, a, bb, server := pairUp(b)
		pr, err := p.Splice(a, bb)
		require.NoError(b, err)
		ran := runInBackground(pr, a, bb) // for a direction the verdict leaves to user space
		rate := send(client, server, n)
		client.Close()
		server.Close()
		<-ran
		pr.Remove()
		return rate
	}
	relay := func(n int) float64 {
		client, a, bb, server := pairUp(b)
		go io.Copy(bb, a) // splices: both are *net.TCPConn
		return send(client, server, n)
	}
	n := max(b.N, 64<<20)
	var d, k, r []float64
	for range 5 {
		d, k, r = append(d, direct(n/5)), append(k, kernel(n/5)), append(r, relay(n/5))
	}
	b.ReportMetric(median(d), "direct-MiB/s")
	b.ReportMetric(median(k), "kernel-MiB/s")
	b.ReportMetric(median(r), "relay-MiB/s")
	b.ReportMetric(median(k)/median(d), "kernel/direct")
	b.ReportMetric(median(k)/median(r), "kernel/relay")
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// TestRunStartedLate: bytes the kernel moved before Run began count as
// moved, so an end that follows them is passed on at once, not after the
// wait for bytes still in flight runs out.
func TestRunStartedLate(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	defer pr.Remove()
	up := make([]byte, 64<<10)
	rand.Read(up)
	_, err = client.Write(up)
	require.NoError(t, err)
	got := make([]byte, len(up))
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(server, got)
	require.NoError(t, err)

	ran := runInBackground(pr, a, b)
	require.NoError(t, client.CloseWrite())
	n, err := server.Read(make([]byte, 1))
	assert.Equal(t, 0, n)
	assert.ErrorIs(t, err, io.EOF, "the client's end waited for bytes already moved")
	server.Close()
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(client)
	assert.NoError(t, err)
	<-ran
}

// TestBytesSentBeforeTheSplice: what the client sent while the proxy was
// deciding, and did not read, reaches the server without waiting for
// more; so does what the server sent first.
func TestBytesSentBeforeTheSplice(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	_, err := client.Write([]byte("sent while the proxy decided"))
	require.NoError(t, err)
	_, err = server.Write([]byte("a banner"))
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // both are in the proxy's receive queues
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	defer pr.Remove()

	got := make([]byte, len("sent while the proxy decided"))
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(server, got)
	require.NoError(t, err, "bytes sent before the splice wait for more")
	assert.Equal(t, "sent while the proxy decided", string(got))
	got = make([]byte, len("a banner"))
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(client, got)
	require.NoError(t, err)
	assert.Equal(t, "a banner", string(got))
}

// TestSpliceWhileBytesFlow: a pair spliced while the client is sending
// loses nothing: no byte reaches a socket's verdict before its peer can
// take it.
func TestSpliceWhileBytesFlow(t *testing.T) {
	p := newPath(t)
	for round := range 10 {
		client, a, b, server := pairUp(t)
		up := make([]byte, 4<<20)
		rand.Read(up)
		go func() { client.Write(up); client.CloseWrite() }()
		time.Sleep(time.Duration(round) * 100 * time.Microsecond)
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		ran := runInBackground(pr, a, b)
		server.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(server)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, len(up), len(got), "round %d", round)
		assert.True(t, bytes.Equal(up, got), "round %d: other bytes", round)
		server.Close()
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.ReadAll(client)
		<-ran
		pr.Remove()
	}
}

// TestSlowReaderHoldsTheSenderBack: a server that reads nothing holds the
// client back, as it would without the kernel path: what the kernel
// queues for it stays bounded (MaxQueued and the sockets' buffers), and
// every byte still arrives, in order, once the server reads.
func TestSlowReaderHoldsTheSenderBack(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	_, ran := spliced(t, p, a, b)

	// The stream is a pattern the server can check at every offset.
	at := func(off int) byte { return byte(off*7 + off/251) }
	buf := make([]byte, 1<<20)
	client.SetWriteDeadline(time.Now().Add(2 * time.Second))
	var sent int
	for {
		for k := range buf {
			buf[k] = at(sent + k)
		}
		n, err := client.Write(buf)
		sent += n
		if err != nil {
			break
		}
	}
	t.Logf("the client sent %d KiB before it was held back", sent>>10)
	assert.Less(t, sent, 64<<20, "the kernel took %d MiB for a server that reads nothing", sent>>20)

	// Every byte arrives, in order.
	require.NoError(t, client.CloseWrite())
	server.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(server)
	require.NoError(t, err)
	require.Equal(t, sent, len(got))
	for off, c := range got {
		if c != at(off) {
			require.Failf(t, "bytes out of order", "at offset %d", off)
		}
	}
	server.Close()
	r := <-ran
	require.NoError(t, r.err)
	assert.EqualValues(t, sent, r.up, "bytes counted up")
}

// TestSlowReaderAfterTheEnd: a server busy for seconds while the client
// sends all and half-closes still gets every byte, in order, before the
// end: a stream within the room of the server's side's send queue (all
// on the kernel path) and one past MaxQueued (the rest relayed in user
// space after the queue drains).
func TestSlowReaderAfterTheEnd(t *testing.T) {
	p := newPath(t)
	at := func(off int) byte { return byte(off*7 + off/251) }
	for _, size := range []int{32 << 10, MaxQueued + 1<<20} {
		client, a, b, server := pairUp(t)
		require.NoError(t, b.SetWriteBuffer(64<<10)) // little room outside the kernel path's queue
		require.NoError(t, server.SetReadBuffer(64<<10))
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		ran := runInBackground(pr, a, b)
		up := make([]byte, size)
		for k := range up {
			up[k] = at(k)
		}
		wrote := make(chan error, 1)
		go func() { // held back once the buffers on the way are full
			client.SetWriteDeadline(time.Now().Add(30 * time.Second))
			_, err := client.Write(up)
			wrote <- errors.Join(err, client.CloseWrite())
		}()
		time.Sleep(6 * time.Second) // the server is busy
		server.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(server)
		require.NoError(t, err)
		require.NoError(t, <-wrote)
		require.Equal(t, size, len(got), "the end overtook bytes (%d sent)", size)
		for off, c := range got {
			if c != at(off) {
				require.Failf(t, "bytes out of order", "at offset %d of %d", off, size)
			}
		}
		server.Close()
		r := <-ran
		require.NoError(t, r.err)
		assert.EqualValues(t, size, r.up)
		pr.Remove()
	}
}

// TestTinySegmentsHeldBack: a sender of one-byte segments to a server
// that reads nothing is held back before the kernel's memory grows much:
// each queued skb costs about a kilobyte whatever its bytes, and the bound
// counts it (a million such segments took 1.8 GiB of slab before).
func TestTinySegmentsHeldBack(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	require.NoError(t, b.SetWriteBuffer(64<<10))
	require.NoError(t, server.SetReadBuffer(64<<10))
	require.NoError(t, client.SetNoDelay(true))
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	ran := runInBackground(pr, a, b)
	slabBefore := slab(t)
	var fd int
	withFD(client, func(f int) error { fd = f; return nil })
	sent := 0
	for end := time.Now().Add(5 * time.Second); sent < 1_000_000 && time.Now().Before(end); {
		n, err := unix.Write(fd, []byte{'x'})
		if err == unix.EAGAIN {
			time.Sleep(time.Millisecond) // held back
			continue
		}
		require.NoError(t, err)
		sent += n
	}
	grown := slab(t) - slabBefore
	t.Logf("%d one-byte segments sent; the kernel's slab grew %d MiB", sent, grown>>20)
	assert.Less(t, grown, int64(256<<20), "the kernel's memory for %d one-byte segments", sent)
	client.Close()
	server.Close()
	<-ran
	pr.Remove()
}

// slab is the kernel's slab memory, in bytes (/proc/meminfo).
func slab(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Slab:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	require.Fail(t, "no Slab in /proc/meminfo")
	return 0
}

// TestClientGoneBeforeTheServerEnds: a client that has read its answer
// and closed, whose kernel then resets what the server sends after (a TLS
// close_notify, say), ends the pair without an error once the server
// ends, as a relay's would: there is nothing left to tell the client.
func TestClientGoneBeforeTheServerEnds(t *testing.T) {
	p := newPath(t)
	for round := range 20 {
		client, a, b, server := pairUp(t)
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		ran := runInBackground(pr, a, b)
		_, err = client.Write([]byte("request"))
		require.NoError(t, err)
		got := make([]byte, len("request"))
		server.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadFull(server, got)
		require.NoError(t, err)
		_, err = server.Write([]byte("answer"))
		require.NoError(t, err)
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadFull(client, make([]byte, len("answer")))
		require.NoError(t, err)
		client.Close()
		time.Sleep(20 * time.Millisecond)
		server.Write([]byte("goodbye")) // to a client gone: reset
		time.Sleep(20 * time.Millisecond)
		server.Close()
		select {
		case r := <-ran:
			assert.NoError(t, r.err, "round %d", round)
		case <-time.After(10 * time.Second):
			require.Fail(t, "Run did not end", "round %d", round)
		}
		pr.Remove()
	}
}

// TestIdlePairsHoldNoGoroutine: an idle pair's Run waits in its caller's
// goroutine alone, for its second socket through the Path's watcher,
// which still wakes it at that socket's end.
func TestIdlePairsHoldNoGoroutine(t *testing.T) {
	p := newPath(t)
	const pairs = 20
	type running struct {
		client, server *net.TCPConn
		ran            <-chan runResult
	}
	var all []running
	before := runtime.NumGoroutine()
	for range pairs {
		client, a, b, server := pairUp(t)
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		t.Cleanup(pr.Remove)
		all = append(all, running{client, server, runInBackground(pr, a, b)})
	}
	time.Sleep(100 * time.Millisecond)
	assert.Less(t, runtime.NumGoroutine()-before, pairs+pairs/2, "goroutines for %d idle pairs, their callers' among them", pairs)
	for _, r := range all {
		r.server.Write([]byte("late"))
		r.server.CloseWrite() // the second socket's end, seen by the watcher
		got, err := io.ReadAll(r.client)
		require.NoError(t, err)
		assert.Equal(t, "late", string(got))
		r.client.CloseWrite()
		select {
		case res := <-r.ran:
			assert.NoError(t, res.err)
			assert.EqualValues(t, len("late"), res.down)
		case <-time.After(5 * time.Second):
			require.Fail(t, "Run did not end")
		}
	}
}

// TestClosingEndsRun: the caller ends a pair by closing its sockets (as
// tproxy does on a policy change), and Run returns, failed.
func TestClosingEndsRun(t *testing.T) {
	p := newPath(t)
	client, a, b, _ := pairUp(t)
	_, ran := spliced(t, p, a, b)
	client.Write([]byte("some bytes"))
	time.Sleep(50 * time.Millisecond)
	r := abortAndAwait(t, a, b, ran)
	assert.ErrorIs(t, r.err, net.ErrClosed)
}

// abortAndAwait resets and closes both sockets of a running pair, as
// tproxy's abort does, and returns what its Run returned, failing the
// test if Run does not return.
func abortAndAwait(t *testing.T, a, b *net.TCPConn, ran <-chan runResult) runResult {
	t.Helper()
	for _, c := range []*net.TCPConn{a, b} {
		c.SetLinger(0)
		c.Close()
	}
	select {
	case r := <-ran:
		return r
	case <-time.After(5 * time.Second):
		require.Fail(t, "Run did not end when its sockets were closed")
		return runResult{}
	}
}
