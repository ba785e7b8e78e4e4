package tproxy

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHandoverAskAfterTheOtherEnded: a direction that reaches its mark
// after the other asked for a handover and then ended goes on relaying:
// the stop the other's ask put on its source is taken back. It had
// failed its next read at once, which ended the connection with an
// i/o timeout as its reason (a mirror's bulk upload, now and then).
func TestHandoverAskAfterTheOtherEnded(t *testing.T) {
	ln := listenLoop(t, "127.0.0.1:0")
	var srcs [2]net.Conn
	for i := range srcs {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		peer, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(); peer.Close() })
		_, err = io.WriteString(peer, "more")
		require.NoError(t, err)
		srcs[i] = c
	}
	h := &handover{after: 1, srcs: srcs}
	require.True(t, h.ask(0), "nothing has ended")
	h.end(0)
	assert.False(t, h.ask(1), "handed over with a direction ended")
	buf := make([]byte, 4)
	_, err := io.ReadFull(srcs[1], buf)
	assert.NoError(t, err, "the going direction's source is still stopped")
	assert.Equal(t, "more", string(buf))
}
