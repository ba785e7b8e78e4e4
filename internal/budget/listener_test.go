package budget

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestListenerBoundsPerSource: a source's connections beyond its bound are
// closed at once; another source's are not; closing one makes room.
func TestListenerBoundsPerSource(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &Listener{Listener: inner, PerSource: 2, Total: 10}
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	closedAtOnce := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	a1, a2 := dial("127.0.0.1"), dial("127.0.0.1")
	first := <-accepted
	<-accepted
	assert.True(t, closedAtOnce(dial("127.0.0.1")), "a third connection from one source")
	assert.False(t, closedAtOnce(dial("127.0.0.2")), "another source's connection")
	<-accepted
	assert.False(t, closedAtOnce(a1))
	assert.False(t, closedAtOnce(a2))
	first.Close()
	assert.False(t, closedAtOnce(dial("127.0.0.1")), "after one closed")
}
