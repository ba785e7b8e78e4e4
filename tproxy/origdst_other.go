//go:build !linux

package tproxy

import (
	"errors"
	"net"
	"net/netip"
)

// OriginalDst reads a redirected connection's original destination from
// conntrack, which only Linux has: elsewhere it always fails, and the
// transparent proxy refuses every connection unless Proxy.OriginalDst
// says otherwise. The explicit proxy needs no original destination.
func OriginalDst(*net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("tproxy: original destinations are read on Linux only")
}
