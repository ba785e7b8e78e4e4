//go:build linux

package nftrules

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/testkit"
)

// forgingPod is a Pod namespace with the sidecar rules and, beyond its
// default route, a host (198.18.99.1, fd00:99::1) that nothing allows.
func forgingPod(t *testing.T) (pod, up *netns.NS) {
	testkit.RequireNamespaces(t)
	pod, up = testkit.NewNS(t, "fg-pod"), testkit.NewNS(t, "fg-up")
	require.NoError(t, netns.Veth(pod, "eth0", up, "eth0"))
	require.NoError(t, pod.IPBatch(
		[]string{"addr", "add", "198.18.7.2/24", "dev", "eth0"},
		[]string{"addr", "add", "fd00:7::2/64", "dev", "eth0", "nodad"},
		[]string{"route", "add", "default", "via", "198.18.7.1"},
		[]string{"route", "add", "::/0", "via", "fd00:7::1"},
	))
	require.NoError(t, up.IPBatch(
		[]string{"addr", "add", "198.18.7.1/24", "dev", "eth0"},
		[]string{"addr", "add", "fd00:7::1/64", "dev", "eth0", "nodad"},
		[]string{"addr", "add", "198.18.99.1/32", "dev", "lo"},
		[]string{"addr", "add", "fd00:99::1/128", "dev", "lo"},
	))
	r, err := SidecarRules{Table: netns.Unique("egress_fg"), NetNS: pod.Path()}.Apply()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return pod, up
}

// freebindControl lets a socket be bound to an address the namespace
// does not have (IP_FREEBIND, IPV6_FREEBIND: no privilege needed).
func freebindControl(v6 bool) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var err error
		rc.Control(func(fd uintptr) {
			if v6 {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1)
			} else {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
			}
		})
		return err
	}
}

// TestSandboxCannotForgeAFlowFromOutside: a sandbox process sends a
// datagram "from" a host outside (a freebind socket bound to its address)
// "to" the Pod, over loopback. Had it left, conntrack would hold a flow
// the outside host began, and the sandbox's own datagrams to that host
// would pass as its replies, past the DNS filter and the proxy. No
// sandbox packet leaves from an address the Pod does not have.
func TestSandboxCannotForgeAFlowFromOutside(t *testing.T) {
	pod, up := forgingPod(t)
	const sandbox = 1000
	for _, tc := range []struct{ name, outside, pod string }{
		{"ipv6", "fd00:99::1", "fd00:7::2"},
		{"ipv6 DNS port", "fd00:99::1", "fd00:7::2"},
		{"ipv4", "198.18.99.1", "198.18.7.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := uint16(4444)
			if tc.name == "ipv6 DNS port" {
				port = 53
			}
			outside := netip.AddrPortFrom(netip.MustParseAddr(tc.outside), port)
			local := netip.AddrPortFrom(netip.MustParseAddr(tc.pod), 9000)
			server, err := udpAs(up, 0, "udp", outside)
			require.NoError(t, err)
			defer server.Close()
			reached := make(chan string, 16)
			go answer(server, reached)

			c, err := udpAs(pod, sandbox, "udp", local)
			require.NoError(t, err)
			defer c.Close()
			var forger net.PacketConn
			require.NoError(t, pod.Do(func() error {
				if err := unix.Setfsuid(sandbox); err != nil {
					return err
				}
				defer unix.Setfsuid(0)
				lc := net.ListenConfig{Control: freebindControl(local.Addr().Is6())}
				var err error
				forger, err = lc.ListenPacket(context.Background(), "udp", outside.String())
				return err
			}))
			defer forger.Close()
			_, err = forger.WriteTo([]byte("forged"), net.UDPAddrFromAddrPort(local))
			assert.Error(t, err, "a datagram from an address the Pod does not have left the socket")

			c.WriteToUDPAddrPort([]byte("exfiltrated"), outside)
			select {
			case got := <-reached:
				assert.Fail(t, "the outside host was reached", "it received %q", got)
			case <-time.After(500 * time.Millisecond):
			}
		})
	}
}

// TestSandboxCannotForgeATCPFlowFromOutside: the same with TCP. A
// listener of the sandbox's that drops every packet (a socket filter, no
// privilege) would swallow a forged SYN "from" the outside host, leaving
// conntrack a flow the outside host began; the sandbox's connect from
// the listener's port to that host would then be its reply (a
// simultaneous open), never redirected to the proxy.
func TestSandboxCannotForgeATCPFlowFromOutside(t *testing.T) {
	pod, up := forgingPod(t)
	const sandbox = 1000
	outside := netip.MustParseAddrPort("[fd00:99::1]:4444")
	local := netip.MustParseAddrPort("[fd00:7::2]:9000")
	var srv net.Listener
	require.NoError(t, up.Do(func() (err error) { srv, err = net.Listen("tcp6", outside.String()); return err }))
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("served by the outside host\n"))
			c.Close()
		}
	}()
	socket := func() int {
		fd := -1
		require.NoError(t, pod.Do(func() (err error) {
			if err := unix.Setfsuid(sandbox); err != nil {
				return err
			}
			defer unix.Setfsuid(0)
			fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			return err
		}))
		t.Cleanup(func() { unix.Close(fd) })
		require.NoError(t, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1))
		return fd
	}
	sa := func(ap netip.AddrPort) *unix.SockaddrInet6 {
		return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}

	swallow := socket()
	require.NoError(t, unix.Bind(swallow, sa(local)))
	dropAll := []unix.SockFilter{{Code: 0x06, K: 0}} // BPF_RET 0
	require.NoError(t, unix.SetsockoptSockFprog(swallow, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &dropAll[0]}))
	require.NoError(t, unix.Listen(swallow, 8))
	forger := socket()
	require.NoError(t, unix.SetsockoptInt(forger, unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1))
	require.NoError(t, unix.Bind(forger, sa(outside)))
	require.NoError(t, unix.SetNonblock(forger, true))
	unix.Connect(forger, sa(local)) // EINPROGRESS at best
	time.Sleep(100 * time.Millisecond)
	unix.Close(forger)
	unix.Close(swallow)

	conn := socket()
	require.NoError(t, unix.Bind(conn, sa(local)))
	require.NoError(t, unix.SetsockoptTimeval(conn, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 2}))
	require.NoError(t, unix.SetsockoptTimeval(conn, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}))
	if err := unix.Connect(conn, sa(outside)); err == nil {
		buf := make([]byte, 64)
		n, _ := unix.Read(conn, buf)
		assert.Zero(t, n, "the sandbox spoke TCP with the outside host past the proxy: %q", buf[:max(n, 0)])
	}
}
