//go:build !unix

package dnsfilter

import (
	"net"
	"net/netip"
)

// sender is unix-only; elsewhere replies are written as the socket takes
// them.
type sender struct{}

func newSender(*net.UDPConn) *sender { return nil }

func (*sender) send([]byte, []byte, netip.AddrPort) error { return errWouldBlock }
