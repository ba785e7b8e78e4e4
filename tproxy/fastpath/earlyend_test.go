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
	"golang.org/x/sys/unix"
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

// TestSpliceRefusesWaitingUrgentData: a socket whose TCP urgent data
// (MSG_OOB) waits unread does not join the kernel path: the kernel
// counts its receive queue only up to the urgent mark, so what the
// caller had read would be overcounted, and an end seen early believed
// (the last 32 KiB of a stream cut off). The sockets stay as they were,
// every byte still to be read.
func TestSpliceRefusesWaitingUrgentData(t *testing.T) {
	p := newPath(t)
	client, a, b, _ := pairUp(t)
	_, err := client.Write([]byte("x"))
	require.NoError(t, err)
	rc, err := client.SyscallConn()
	require.NoError(t, err)
	var serr error
	require.NoError(t, rc.Control(func(fd uintptr) { serr = unix.Sendto(int(fd), []byte("!"), unix.MSG_OOB, nil) }))
	require.NoError(t, serr)
	_, err = client.Write(make([]byte, 1000))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		withFD(a, func(fd int) error { n, _ = unix.IoctlGetInt(fd, unix.SIOCINQ); return nil })
		return n > 0
	}, 5*time.Second, time.Millisecond)

	_, err = p.Splice(a, b)
	assert.ErrorIs(t, err, ErrUrgentData)
	require.NoError(t, client.CloseWrite())
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(a) // the urgent byte out of band, as without SO_OOBINLINE
	require.NoError(t, err)
	assert.Equal(t, 1+1000, len(got))

	// Its slots are free again: a pair without urgent data still joins.
	client2, a2, b2, _ := pairUp(t)
	_, err = client2.Write([]byte("plain"))
	require.NoError(t, err)
	pr, err := p.Splice(a2, b2)
	require.NoError(t, err)
	pr.Remove()
}

// TestInlineUrgentDataAtTheSplice: a socket that reads urgent data inline
// (SO_OOBINLINE, as tproxy's relay sets it) joins the kernel path with
// its urgent byte waiting, and that byte goes on inline, in its place:
// nothing is lost, nothing cut short.
func TestInlineUrgentDataAtTheSplice(t *testing.T) {
	p := newPath(t)
	client, a, b, server := pairUp(t)
	require.NoError(t, withFD(a, func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1) }))
	_, err := client.Write([]byte("before"))
	require.NoError(t, err)
	require.NoError(t, withFD(client, func(fd int) error { return unix.Sendto(fd, []byte("!"), unix.MSG_OOB, nil) }))
	_, err = client.Write([]byte("after"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		withFD(a, func(fd int) error { n, _ = unix.IoctlGetInt(fd, unix.SIOCINQ); return nil })
		return n == len("before!after")
	}, 5*time.Second, time.Millisecond, "the bytes never all arrived")

	_, ran := spliced(t, p, a, b)
	require.NoError(t, client.CloseWrite())
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(server)
	require.NoError(t, err)
	assert.Equal(t, "before!after", string(got))
	server.Close()
	r := <-ran
	require.NoError(t, r.err)
	assert.EqualValues(t, len("before!after"), r.up)
}
