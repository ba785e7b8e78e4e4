//go:build !linux

package tproxy

import (
	"net"
	"time"
)

// canSplice: only Linux splices; elsewhere every byte is copied through
// user space.
const canSplice = false

// copy moves bytes from src to dst until src's end of stream.
func (r *relay) copy(dst, src net.Conn, pace *pacer) (int64, error) {
	return r.copyTracked(dst, src, pace)
}

// idle returns how long no byte has moved either way.
func (r *relay) idle() time.Duration { return r.sinceActive() }
