package tproxy

import (
	"math"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClosedSocketIsIdle: a socket that cannot say when it last received
// (closed) is idle without end, so the idle sweep ends its relay.
func TestClosedSocketIsIdle(t *testing.T) {
	ln := listenLoop(t, "127.0.0.1:0")
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	require.Less(t, idleFor(c.(*net.TCPConn)), time.Minute, "a fresh connection")
	c.Close()
	assert.Equal(t, time.Duration(math.MaxInt64), idleFor(c.(*net.TCPConn)))
}
