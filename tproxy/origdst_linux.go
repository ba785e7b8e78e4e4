package tproxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSoOriginalDst = 80

// OriginalDst returns the destination a connection redirected by nftables
// (or iptables) REDIRECT was addressed to, read from conntrack with
// SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6).
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("tproxy: original destination: %w", err)
	}
	local, _ := c.LocalAddr().(*net.TCPAddr)
	v6 := local != nil && local.AddrPort().Addr().Unmap().Is6()
	var ap netip.AddrPort
	var sockErr error
	err = rc.Control(func(fd uintptr) {
		if v6 {
			// sockaddr_in6 is 28 bytes; IPv6MTUInfo is a buffer of 32.
			var info *unix.IPv6MTUInfo
			info, sockErr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSoOriginalDst)
			if sockErr == nil {
				sa := info.Addr
				port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
				ap = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
			}
			return
		}
		// sockaddr_in is 16 bytes; IPv6Mreq is a buffer of 20.
		var mreq *unix.IPv6Mreq
		mreq, sockErr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if sockErr == nil {
			b := mreq.Multiaddr // family(2) port(2) addr(4) zero(8)
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
		}
	})
	if err == nil {
		err = sockErr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("tproxy: original destination: %w", err)
	}
	return ap, nil
}
