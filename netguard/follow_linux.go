package netguard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
)

// ifaceAddr is one address of one interface: the same address on two
// interfaces is the host's until both lose it.
type ifaceAddr struct {
	index uint32
	addr  netip.Addr
}

// kernelFollower applies the kernel's announcements of address changes
// (RTM_NEWADDR, RTM_DELADDR) to the addresses it knows, which a dump of
// every address (RTM_GETADDR) sets again when announcements were lost.
type kernelFollower struct {
	*follower
	sock  *os.File
	addrs map[ifaceAddr]struct{}
}

// start subscribes to the announcements, then dumps the addresses, so
// that no change falls between the two (one seen in both is applied
// twice, which changes nothing). Without the subscription (no netlink
// here) it polls.
func (f *follower) start() (func(context.Context), error) {
	sock, err := subscribeAddresses()
	if err != nil {
		if err := f.list(); err != nil {
			return nil, err
		}
		return f.poll, nil
	}
	k := &kernelFollower{follower: f, sock: sock}
	if err := k.dump(); err != nil {
		sock.Close()
		return nil, err
	}
	return k.run, nil
}

// subscribeAddresses opens a netlink socket in this network namespace
// that receives every IPv4 and IPv6 address change. It is read through
// the runtime's poller, so that closing it ends a read in progress.
func subscribeAddresses() (*os.File, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, syscall.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	const ipv4Addresses, ipv6Addresses = 0x10, 0x100 // RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR (rtnetlink.h)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK, Groups: ipv4Addresses | ipv6Addresses}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "netlink address changes"), nil
}

// run reads announcements until ctx ends. Lost ones (the socket's buffer
// overflowed) are made up for by a dump; a socket that fails otherwise
// leaves the follower polling.
func (k *kernelFollower) run(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { k.sock.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, err := k.sock.Read(buf)
		switch {
		case errors.Is(err, syscall.ENOBUFS):
			k.dump()
			continue
		case err != nil:
			if ctx.Err() == nil {
				k.sock.Close()
				k.poll(ctx)
			}
			return
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			k.dump()
			continue
		}
		k.apply(msgs)
	}
}

// dump sets the known addresses to the kernel's list of them.
func (k *kernelFollower) dump() error {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
	if err != nil {
		return fmt.Errorf("netguard: list interface addresses: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return fmt.Errorf("netguard: list interface addresses: %w", err)
	}
	k.addrs = map[ifaceAddr]struct{}{}
	k.apply(msgs)
	return nil
}

// apply adds the addresses of RTM_NEWADDR messages and removes those of
// RTM_DELADDR ones, then gives the Guard the result.
func (k *kernelFollower) apply(msgs []syscall.NetlinkMessage) {
	for _, m := range msgs {
		if m.Header.Type != syscall.RTM_NEWADDR && m.Header.Type != syscall.RTM_DELADDR {
			continue
		}
		a, ok := parseIfaddr(m)
		if !ok || !k.counts(a.addr) {
			continue // (an agent's address, in a pool never dialled: nothing to build again)
		}
		if m.Header.Type == syscall.RTM_NEWADDR {
			k.addrs[a] = struct{}{}
		} else {
			delete(k.addrs, a)
		}
	}
	addrs := make([]netip.Addr, 0, len(k.addrs))
	for a := range k.addrs {
		addrs = append(addrs, a.addr)
	}
	k.set(addrs)
}

// parseIfaddr reads the interface and the local address of an address
// message: for IPv4 IFA_LOCAL where there is one (on a point-to-point
// link IFA_ADDRESS is the peer's), else IFA_ADDRESS, as the net
// package reads them.
func parseIfaddr(m syscall.NetlinkMessage) (ifaceAddr, bool) {
	if len(m.Data) < syscall.SizeofIfAddrmsg {
		return ifaceAddr{}, false
	}
	family, index := m.Data[0], binary.NativeEndian.Uint32(m.Data[4:8]) // struct ifaddrmsg
	attrs, err := syscall.ParseNetlinkRouteAttr(&m)
	if err != nil {
		return ifaceAddr{}, false
	}
	var local, address netip.Addr
	for _, attr := range attrs {
		a, ok := netip.AddrFromSlice(attr.Value)
		if !ok {
			continue
		}
		switch attr.Attr.Type {
		case syscall.IFA_LOCAL:
			local = a
		case syscall.IFA_ADDRESS:
			address = a
		}
	}
	if family == syscall.AF_INET && local.IsValid() {
		address = local
	}
	if !address.IsValid() {
		return ifaceAddr{}, false
	}
	return ifaceAddr{index: index, addr: address}, true
}
