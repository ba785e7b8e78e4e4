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
	client, a, b, server, _, ran := smallBuffered(t, p, false)

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

// TestDirectionComesBack: a direction the verdict left to user space
// (its receiver fell MaxQueued behind) comes back to the kernel path once
// user space has relayed what was left to it, so that one burst does not
// keep a long connection's bytes in the gateway's process. Every byte
// arrives once, in order, and is counted once.
func TestDirectionComesBack(t *testing.T) {
	p := newPath(t)
	client, _, _, server, pr, ran := smallBuffered(t, p, false)

	// A burst past MaxQueued to a server that reads nothing for a while.
	const burst = MaxQueued + 2<<20
	sent := make(chan int, 1)
	go func() { sent <- sendStream(client, 0, burst, 20*time.Second) }()
	time.Sleep(time.Second)
	n, err := readStream(server, 0, burst, 20*time.Second)
	require.NoError(t, err, "at %d", n)
	require.Equal(t, burst, <-sent)
	require.Eventually(t, func() bool { return pr.relayed[0].Load() > 0 }, 5*time.Second, 10*time.Millisecond,
		"the burst never left the kernel path: the test shows nothing")

	// Then bytes at a pace the server keeps up with.
	time.Sleep(100 * time.Millisecond)
	before := pr.moved(0)
	const paced, chunk = 1 << 20, 32 << 10
	go func() {
		off := burst
		for ; off < burst+paced; off += chunk {
			if sendStream(client, off, chunk, 5*time.Second) < chunk {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		sent <- off - burst
	}()
	n, err = readStream(server, burst, paced, 20*time.Second)
	require.NoError(t, err, "at %d", burst+n)
	require.Equal(t, paced, <-sent)
	assert.GreaterOrEqual(t, pr.moved(0)-before, int64(paced-chunk), "the direction stayed in user space after its burst")

	require.NoError(t, client.CloseWrite())
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(server)
	require.NoError(t, err)
	assert.Empty(t, rest, "bytes after the end")
	server.Close()
	r := <-ran
	require.NoError(t, r.err)
	assert.EqualValues(t, burst+paced, r.up, "bytes counted up")
}
