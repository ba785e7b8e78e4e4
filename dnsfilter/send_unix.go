//go:build unix

package dnsfilter

import (
	"errors"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// sender sends on a UDP socket without ever waiting for room in its send
// buffer.
type sender struct {
	rc syscall.RawConn
	v6 bool // an AF_INET6 socket: IPv4 destinations go as mapped addresses
}

func newSender(c *net.UDPConn) *sender {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sender{rc: rc}
	var serr error
	err = rc.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		sa, serr = unix.Getsockname(int(fd))
		_, s.v6 = sa.(*unix.SockaddrInet6)
	})
	if err != nil || serr != nil {
		return nil
	}
	return s
}

// send sends b to to with the control message oob, or returns
// errWouldBlock at once if the socket has no room for it.
func (s *sender) send(b, oob []byte, to netip.AddrPort) error {
	var sa unix.Sockaddr
	switch a := to.Addr(); {
	case s.v6:
		sa = &unix.SockaddrInet6{Port: int(to.Port()), Addr: a.As16()}
	case a.Is4():
		sa = &unix.SockaddrInet4{Port: int(to.Port()), Addr: a.As4()}
	default:
		return errors.New("dnsfilter: an IPv6 destination on an IPv4 socket")
	}
	var serr error
	err := s.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, oob, sa, unix.MSG_DONTWAIT)
		return true // never wait for the socket to become writable
	})
	switch {
	case err != nil:
		return err
	case errors.Is(serr, unix.EAGAIN), errors.Is(serr, unix.EWOULDBLOCK), errors.Is(serr, unix.ENOBUFS):
		return errWouldBlock
	}
	return serr
}
