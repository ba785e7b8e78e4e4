//go:build linux

package fastpath

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClosingEndsRunAfterALeftDirection: once the verdict has left
// a's direction to user space (Run stops waiting on a's poller and waits
// on woken), and that direction has ended, closing both sockets (what
// tproxy's abort does: Rejudge, Forget, idle sweep, Shutdown) must end Run.
func TestClosingEndsRunAfterALeftDirection(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	require.NoError(t, b.SetWriteBuffer(64<<10))
	require.NoError(t, server.SetReadBuffer(64<<10))
	pr, err := p.Splice(a, b)
	require.NoError(t, err)
	defer pr.Remove()
	ran := runInBackground(pr, a, b)

	up := make([]byte, MaxQueued+2<<20) // past MaxQueued: a's direction is left to user space
	go func() {
		client.SetWriteDeadline(time.Now().Add(20 * time.Second))
		client.Write(up)
		client.CloseWrite()
	}()
	time.Sleep(2 * time.Second) // the server is slow: the verdict gives up on a
	server.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(server) // all of it, and the end: relayRest(a) is done
	require.NoError(t, err)
	require.Equal(t, len(up), len(got))
	time.Sleep(100 * time.Millisecond)

	// The server stays connected and silent; the gateway aborts the pair.
	r := abortAndAwait(t, a, b, ran)
	assert.ErrorIs(t, r.err, net.ErrClosed)
}
