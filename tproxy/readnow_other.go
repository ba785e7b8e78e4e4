//go:build !unix

package tproxy

import (
	"errors"
	"net"
)

// readNow would read what c already has without waiting; where sockets
// cannot be asked so, it reads nothing, and the session waits for the
// client's first bytes in the background.
func readNow(_ net.Conn, buf []byte) ([]byte, error) { return buf, nil }

// awaitBytes would wait for c to have bytes or its end; where sockets
// cannot be peeked at, it cannot.
func awaitBytes(net.Conn) (gone bool, err error) { return false, errors.ErrUnsupported }
