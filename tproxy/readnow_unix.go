//go:build unix

package tproxy

import (
	"errors"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// readNow reads what c already has into the free capacity of buf, without
// waiting; no bytes and no error means the client has not spoken yet (or
// c is not a socket that can be asked).
func readNow(c net.Conn, buf []byte) ([]byte, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return buf, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return buf, err
	}
	var n int
	var readErr error
	if err := rc.Read(func(fd uintptr) bool {
		n, readErr = unix.Read(int(fd), buf[len(buf):cap(buf)])
		return true // one attempt: the socket is non-blocking
	}); err != nil {
		return buf, err
	}
	switch {
	case readErr == unix.EAGAIN || readErr == unix.EINTR:
		return buf, nil
	case readErr != nil:
		return buf, readErr
	case n == 0:
		return buf, io.EOF
	}
	return buf[:len(buf)+n], nil
}

// awaitBytes waits, reading nothing, until c has bytes to read, its end
// of stream or an error (gone: the end or the error), or until its read
// deadline passes (err).
func awaitBytes(c net.Conn) (gone bool, err error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false, errors.ErrUnsupported
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, err
	}
	var probe [1]byte
	var n int
	var peekErr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, peekErr = unix.Recvfrom(int(fd), probe[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return peekErr != unix.EAGAIN
	}); err != nil {
		return false, err
	}
	return peekErr != nil || n == 0, nil
}
