package tproxy

import (
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
)

// wrappingListener yields its connections wrapped, as listeners that
// count bytes or speak the PROXY protocol do; the wrapper exposes the
// connection beneath with NetConn.
type wrappingListener struct{ net.Listener }

type wrappedConn struct{ net.Conn }

func (c wrappedConn) NetConn() net.Conn { return c.Conn }

func (l wrappingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wrappedConn{c}, nil
}

// TestWrappedConnections serves the transparent and the explicit proxy on
// listeners whose connections are not *net.TCPConn: both must work, with
// a plain copy where splice cannot apply, and record what they did.
func TestWrappedConnections(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*"}, nil)
	w.setNames("svc.test")

	transparent := wrappingListener{listenLoop(t, "127.0.0.1:0")}
	explicit := wrappingListener{listenLoop(t, "127.0.0.1:0")}
	go w.proxy.Serve(transparent)
	go w.proxy.ServeExplicit(explicit)

	w.origDst.Store(w.echoAddr)
	require.NoError(t, echoThrough(transparent.Addr().String()), "a transparent connection through a wrapping listener")
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTCP && r.Host == "svc.test" })
	assert.True(t, rec.Allowed)
	assert.Equal(t, int64(len("ping")), rec.BytesUp)
	assert.Equal(t, int64(len("echo:ping")), rec.BytesDown)

	require.NoError(t, connectThrough(explicit.Addr().String(), fmt.Sprintf("svc.test:%d", w.echoAddr.Port())),
		"an allowed CONNECT through a wrapping listener")
	rec = w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindConnect && r.Host == "svc.test" })
	assert.True(t, rec.Allowed)
	assert.Equal(t, int64(len("echo:ping")), rec.BytesDown)
}
