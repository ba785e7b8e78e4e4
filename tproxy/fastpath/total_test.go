//go:build linux

package fastpath

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQueuedBoundAcrossPairs: what all pairs together may have queued is
// bounded, not only each direction: an agent's many connections to
// servers that read nothing would otherwise queue MaxQueued each,
// outside TCP's memory accounting. Past the bound a direction leaves the
// kernel path; every byte still arrives, in order, and once the pairs
// are done, nothing stays charged.
func TestQueuedBoundAcrossPairs(t *testing.T) {
	p := newQueueingPath(t)
	const bound = 6 << 20
	require.NoError(t, p.SetMaxQueuedTotal(bound))
	at := func(off int) byte { return byte(off*7 + off/251) }
	const conns = 4 // 4*MaxQueued would pass the bound well

	type conn struct {
		sent int
		got  []byte
		err  error
		run  runResult
	}
	results := make([]conn, conns)
	servers := make(chan func(), conns)
	var wg sync.WaitGroup
	for k := range conns {
		client, a, b, server := pairUp(t)
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		ran := runInBackground(pr, a, b)
		wg.Go(func() {
			buf := make([]byte, 1<<20)
			client.SetWriteDeadline(time.Now().Add(2 * time.Second))
			for {
				for i := range buf {
					buf[i] = at(results[k].sent + i)
				}
				n, err := client.Write(buf)
				results[k].sent += n
				if err != nil {
					break
				}
			}
			client.CloseWrite()
			// The server reads only once every client is held back.
			servers <- func() {
				server.SetReadDeadline(time.Now().Add(20 * time.Second))
				results[k].got, results[k].err = io.ReadAll(server)
				server.Close()
				results[k].run = <-ran
				pr.Remove()
			}
		})
	}
	wg.Wait()
	queued := p.Queued()
	t.Logf("queued across %d pairs: %d KiB (bound %d KiB)", conns, queued>>10, bound>>10)
	assert.Positive(t, queued)
	assert.LessOrEqual(t, queued, int64(bound+1<<20), "the pairs queued past the bound")

	var readers sync.WaitGroup
	for range conns {
		readers.Go(<-servers)
	}
	readers.Wait()
	for k, r := range results {
		require.NoError(t, r.err, "pair %d", k)
		require.Equal(t, r.sent, len(r.got), "pair %d: bytes sent and received", k)
		for off, c := range r.got {
			if c != at(off) {
				require.Failf(t, "bytes out of order", "pair %d at offset %d", k, off)
			}
		}
		assert.NoError(t, r.run.err, "pair %d", k)
		assert.EqualValues(t, r.sent, r.run.up, "pair %d: bytes counted up", k)
	}
	assert.Zero(t, p.Queued(), "charges left behind by pairs that are done")
}
