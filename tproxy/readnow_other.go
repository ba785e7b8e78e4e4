//go:build !unix

package tproxy

import "net"

// readNow would read what c already has without waiting; where sockets
// cannot be asked so, it reads nothing, and the session waits for the
// client's first bytes in the background.
func readNow(_ net.Conn, buf []byte) ([]byte, error) { return buf, nil }
