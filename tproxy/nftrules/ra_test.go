//go:build linux

package nftrules

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/testkit"
)

// TestAgentRouterAdvertisementIsRefused: a sandbox with a raw socket (root
// in a container runtime's namespace has CAP_NET_RAW) sends an IPv6
// Router Advertisement from its link-local address. Were it admitted
// with the rest of neighbour discovery, the gateway's kernel would take
// the sandbox as a default router, and an on-link prefix option would
// put a prefix the gateway reaches over its uplink onto the agent's link:
// every agent's upstream connections to it would go to the sandbox.
func TestAgentRouterAdvertisementIsRefused(t *testing.T) {
	testkit.RequireNamespaces(t)
	gw, agent, up := testkit.NewNS(t, "ra-gw"), testkit.NewNS(t, "ra-ag"), testkit.NewNS(t, "ra-up")
	require.NoError(t, agent.Sysctl("net.ipv6.conf.default.accept_dad=0"))
	require.NoError(t, netns.Veth(gw, "agent0", agent, "eth0"))
	require.NoError(t, netns.Veth(gw, "uplink0", up, "eth0"))
	for _, step := range []struct {
		ns   *netns.NS
		args []string
	}{
		{gw, []string{"addr", "add", "fd00:aa::1/64", "dev", "agent0", "nodad"}},
		{agent, []string{"addr", "add", "fd00:aa::10/64", "dev", "eth0", "nodad"}},
		{gw, []string{"addr", "add", "fd00:2::2/64", "dev", "uplink0", "nodad"}},
		{up, []string{"addr", "add", "fd00:2::1/64", "dev", "eth0", "nodad"}},
		// The "internet" every agent's connections go to, via the uplink.
		{gw, []string{"-6", "route", "add", "fd00:100::/64", "via", "fd00:2::1"}},
	} {
		require.NoError(t, step.ns.IP(step.args...))
	}
	r, err := GatewayRules{Table: netns.Unique("egress_ra"), NetNS: gw.Path(), DNSPort: 15053, ProxyPort: 15001,
		Links:      []Link{{Interface: "agent0", Addrs: []netip.Addr{netip.MustParseAddr("fd00:aa::10")}}},
		AgentPools: []netip.Prefix{netip.MustParsePrefix("fd00:aa::/64")}}.Apply()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })

	routeGet := func() string {
		out, err := gw.Run(context.Background(), "ip", "-6", "route", "get", "fd00:100::1")
		require.NoError(t, err)
		return out
	}
	require.Contains(t, routeGet(), "dev uplink0", "the gateway reaches fd00:100::/64 over its uplink")

	// The RA: router lifetime 1800 s, and a prefix option for
	// fd00:100::/80, on-link.
	ra := make([]byte, 16+32)
	ra[0] = 134 // Router Advertisement
	ra[4] = 64  // current hop limit
	binary.BigEndian.PutUint16(ra[6:], 1800)
	pio := ra[16:]
	pio[0], pio[1] = 3, 4 // prefix information, 4 × 8 bytes
	pio[2] = 80           // prefix length
	pio[3] = 0x80         // L: on-link
	binary.BigEndian.PutUint32(pio[4:], 3600)
	binary.BigEndian.PutUint32(pio[8:], 1800)
	prefix := netip.MustParseAddr("fd00:100::").As16()
	copy(pio[16:], prefix[:])

	require.NoError(t, agent.Do(func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		// Wait for the link-local address the RA is sent from.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if hasLinkLocal(ifi) {
				break
			}
		}
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, ifi.Index); err != nil {
			return err
		}
		to := &unix.SockaddrInet6{ZoneId: uint32(ifi.Index)}
		copy(to.Addr[:], net.ParseIP("ff02::1").To16())
		return unix.Sendto(fd, ra, 0, to)
	}))

	var got string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = routeGet(); strings.Contains(got, "dev agent0") {
			break
		}
	}
	routes, _ := gw.Run(context.Background(), "ip", "-6", "route", "show")
	assert.NotContains(t, got, "dev agent0", "a sandbox's RA moved the gateway's route to fd00:100::1 onto its link")
	assert.NotContains(t, routes, "proto ra", "the gateway installed routes from a sandbox's RA")
}

func hasLinkLocal(ifi *net.Interface) bool {
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.IsLinkLocalUnicast() {
			return true
		}
	}
	return false
}
