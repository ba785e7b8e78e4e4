//go:build linux

package fastpath

import (
	"bytes"
	"crypto/rand"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEndSeenBeforeTheLastBytes: a direction left to user space reads
// its socket's end while bytes the verdict left to it still wait in the
// kernel's backlog (a receive buffer too small to take them at once).
// Taking that end for the stream's cut the last tens of KiB off a stream
// that looked whole; every byte must arrive, and the counts say so.
func TestEndSeenBeforeTheLastBytes(t *testing.T) {
	p := newPath(t)
	for round := range 3 {
		client, a, b, server := pairUp(t)
		for _, c := range []interface {
			SetReadBuffer(int) error
			SetWriteBuffer(int) error
		}{client, a, b, server} {
			require.NoError(t, c.SetReadBuffer(16<<10))
			require.NoError(t, c.SetWriteBuffer(16<<10))
		}
		pr, err := p.Splice(a, b)
		require.NoError(t, err)
		ran := runInBackground(pr, a, b)

		up := make([]byte, 2*MaxQueued) // past MaxQueued: the direction leaves the kernel path
		rand.Read(up)
		go func() {
			io.Copy(server, server) // a mirror: it reads again once its write went through
			server.CloseWrite()
		}()
		go func() {
			client.SetWriteDeadline(time.Now().Add(20 * time.Second))
			client.Write(up)
			client.CloseWrite()
		}()
		client.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(client)
		require.NoError(t, err)
		assert.Equal(t, len(up), len(got), "round %d: the stream was cut short", round)
		assert.True(t, bytes.Equal(up, got), "round %d: the bytes differ", round)
		select {
		case r := <-ran:
			assert.NoError(t, r.err)
			assert.EqualValues(t, len(up), r.up, "round %d: bytes counted up", round)
			assert.EqualValues(t, len(up), r.down, "round %d: bytes counted down", round)
		case <-time.After(10 * time.Second):
			require.Fail(t, "Run did not end")
		}
		pr.Remove()
	}
}
