//go:build linux

package fastpath

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// burst sends n bytes from client while server reads nothing, and waits
// until the kernel path has charged at least least of them.
func burst(t *testing.T, p *Path, client *net.TCPConn, n int, least int64) {
	t.Helper()
	client.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := client.Write(make([]byte, n))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.Queued() >= least }, 5*time.Second, time.Millisecond,
		"the burst was never charged (%d KiB charged)", p.Queued()>>10)
}

// smallBuffers makes the server's side hold little, so that a burst
// waits on the kernel path rather than in the sockets' buffers.
func smallBuffers(t *testing.T, b, server *net.TCPConn) {
	require.NoError(t, b.SetWriteBuffer(16<<10))
	require.NoError(t, server.SetReadBuffer(16<<10))
}

// TestQuietBurstIsRecharged: a direction that queued a burst and fell
// quiet once its peer had taken it all is charged nothing after a
// recharge, where its verdicts alone would leave it charged its burst;
// its next burst is charged again from there, and once the pair is done
// nothing is left charged, neither too much nor too little.
func TestQuietBurstIsRecharged(t *testing.T) {
	p := newQueueingPath(t)
	client, a, b, server := pairUp(t)
	smallBuffers(t, b, server)
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	ran := runInBackground(pr, a, b)

	const n = 2 << 20
	for round := range 2 {
		burst(t, p, client, n, 1<<20)
		server.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadFull(server, make([]byte, n))
		require.NoError(t, err, "round %d", round)
		// The verdict has not run since the server took the burst.
		stale := p.Queued()
		require.GreaterOrEqual(t, stale, int64(1<<20), "round %d: the burst's charge without a recharge", round)
		require.NoError(t, p.recharge())
		assert.Zero(t, p.Queued(), "round %d: charged after a recharge, with nothing queued (%d KiB before)", round, stale>>10)
	}

	require.NoError(t, client.CloseWrite())
	got, err := io.ReadAll(server)
	require.NoError(t, err)
	assert.Empty(t, got)
	require.NoError(t, server.Close())
	r := <-ran
	require.NoError(t, r.err)
	assert.EqualValues(t, 2*n, r.up, "bytes counted up")
	pr.Remove()
	assert.Zero(t, p.Queued(), "charged once the pair is done")
}

// TestRechargeRunsNearTheBound: the Path recharges by itself while what
// is charged is past a quarter of the bound, so that charges of bytes
// gone hold no more than that quarter; a burst still queued stays
// charged meanwhile.
func TestRechargeRunsNearTheBound(t *testing.T) {
	p := newQueueingPath(t)
	const bound = 4 << 20
	require.NoError(t, p.SetMaxQueuedTotal(bound))
	client, a, b, server := pairUp(t)
	smallBuffers(t, b, server)
	_, ran := spliced(t, p, a, b)

	const n = 3 << 20
	burst(t, p, client, n, bound/4+1<<20)
	passes := p.recharged.Load()
	require.Eventually(t, func() bool { return p.recharged.Load() >= passes+2 }, 2*time.Second, 10*time.Millisecond, "no recharge ran")
	assert.Greater(t, p.Queued(), int64(bound/4+1<<20), "a burst still queued was charged less")

	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadFull(server, make([]byte, n))
	require.NoError(t, err)
	assert.Eventually(t, func() bool { return p.Queued() <= bound/4 }, 2*time.Second, 10*time.Millisecond,
		"a quiet direction's charge was never brought down (%d KiB charged)", p.Queued()>>10)

	require.NoError(t, client.Close())
	require.NoError(t, server.Close())
	<-ran
}

// BenchmarkRecharge times a recharge pass over 1,000 spliced pairs (and
// the 4,000 TCP sockets of their connections), each charged a little.
func BenchmarkRecharge(b *testing.B) {
	if os.Getuid() != 0 {
		b.Skip("the kernel path needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
	const pairs = 1000
	p, err := NewDespiteDefect(pairs)
	require.NoError(b, err)
	b.Cleanup(func() { p.Close() })
	for range pairs {
		client, a, c, server := pairUp(b)
		pr, err := p.Splice(a, c)
		require.NoError(b, err)
		b.Cleanup(pr.Remove)
		_, err = client.Write([]byte("x"))
		require.NoError(b, err)
		_, err = io.ReadFull(server, make([]byte, 1))
		require.NoError(b, err)
	}
	require.Positive(b, p.Queued(), "charges for the recharge to bring down")
	b.ResetTimer()
	for b.Loop() {
		require.NoError(b, p.recharge())
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(4*pairs), "ns/socket")
	assert.Zero(b, p.Queued())
}
