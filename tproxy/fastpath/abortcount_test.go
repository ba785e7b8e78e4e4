//go:build linux

package fastpath

import (
	"crypto/rand"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestAbortCountsWhatTheSocketTook: a pair cut short while the verdict
// holds bytes for a server that reads nothing counts as sent only what
// the server's side took to send (what the server received, and what
// waits in the socket's send queue), as a relay counts what its writes
// put in the socket; the bytes still queued on the kernel path go with
// the reset, unsent. Cut by the server's reset and by the caller's Abort
// followed at once by closing both sockets, as tproxy does.
func TestAbortCountsWhatTheSocketTook(t *testing.T) {
	p := newQueueingPath(t)
	for _, by := range []string{"server reset", "caller abort"} {
		t.Run(by, func(t *testing.T) {
			client, a, b, server := pairUp(t)
			require.NoError(t, b.SetWriteBuffer(16<<10))
			require.NoError(t, server.SetReadBuffer(16<<10))
			pr, err := p.Splice(a, b)
			require.NoError(t, err)
			defer pr.Remove()
			ran := runInBackground(pr, a, b)

			up := make([]byte, MaxQueued/2) // all of it redirected: less than the verdict may queue
			rand.Read(up)
			client.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, err = client.Write(up)
			require.NoError(t, err)
			require.Eventually(t, func() bool { n, _ := pr.Bytes(); return n == int64(len(up)) },
				5*time.Second, 10*time.Millisecond, "the verdict did not redirect every byte")
			took := settledTook(t, b, server)
			require.Less(t, took, int64(len(up))/4, "the server's side took most of the bytes: nothing waits on the kernel path")

			var r runResult
			switch by {
			case "server reset":
				server.SetLinger(0)
				server.Close()
				select {
				case r = <-ran:
				case <-time.After(5 * time.Second):
					require.Fail(t, "Run did not end")
				}
			case "caller abort":
				pr.Abort()
				r = abortAndAwait(t, a, b, ran)
				assert.ErrorIs(t, r.err, ErrAborted)
			}
			require.Error(t, r.err)
			assert.Equal(t, took, r.up, "bytes counted up, of %d the verdict redirected", len(up))
			assert.Zero(t, r.down)
		})
	}
}

// settledTook waits until b's connection to a server that reads nothing
// has settled (its window closed, nothing more moving) and returns what
// b's side took to send: what the server has received (and acknowledged)
// and what waits in b's send queue, unacknowledged. Both are read from
// the sockets, not from the pair.
func settledTook(t *testing.T, b, server *net.TCPConn) int64 {
	t.Helper()
	read := func() int64 {
		var outq, inq int
		require.NoError(t, withFD(b, func(fd int) (err error) {
			outq, err = unix.IoctlGetInt(fd, unix.SIOCOUTQ)
			return err
		}))
		require.NoError(t, withFD(server, func(fd int) (err error) {
			inq, err = unix.IoctlGetInt(fd, unix.SIOCINQ)
			return err
		}))
		return int64(outq + inq)
	}
	var last int64 = -1
	var steady int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		took := read()
		if took == last {
			if steady++; steady == 5 {
				return took
			}
			continue
		}
		last, steady = took, 0
	}
	require.Fail(t, "the connection to the server did not settle")
	return 0
}
