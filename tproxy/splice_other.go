//go:build !linux

package tproxy

import (
	"errors"
	"net"
	"time"
)

// canSplice: only Linux splices; elsewhere every byte is copied through
// user space.
const canSplice = false

// copy moves bytes from src to dst until src's end of stream or limit
// bytes.
func (r *relay) copy(dst, src net.Conn, pace *pacer, limit int64) (int64, error) {
	return r.copyTracked(dst, src, pace, limit)
}

// flush is never called: a handover needs both ends spliced.
func (r *relay) flush(dst, src net.Conn, limit int64) (int64, stop, bool, error) {
	return 0, running, false, errors.ErrUnsupported
}

// clientGone cannot say, here, whether a peer that sent bytes has gone.
func clientGone(net.Conn) (bool, error) { return false, errors.ErrUnsupported }

// urgentInline does nothing: urgent data is read as the system reads it.
func urgentInline(c *net.TCPConn) {}

// idle returns how long no byte has moved either way.
func (r *relay) idle() time.Duration { return r.sinceActive() }
