//go:build linux

package nftrules

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/testkit"
)

// udpAs opens a UDP socket in n owned by uid (the owner nftables' meta
// skuid reads), bound to from.
func udpAs(n *netns.NS, uid int, network string, from netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() error {
		if err := unix.Setfsuid(uid); err != nil {
			return err
		}
		defer unix.Setfsuid(0)
		var err error
		c, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(from))
		return err
	})
	return c, err
}

// TestSandboxCannotJoinTheExemptUIDsFlows: the exempt uid's upstream DNS
// query leaves a conntrack entry that lives on after its socket closes.
// A sandbox process that binds the same port and sends to the same
// resolver sends a packet of that flow: the nat chain, which sees only a
// flow's first packet, never redirects it. It must not leave the Pod
// either; a fresh flow of the sandbox is redirected to the DNS port, and a
// server in the Pod still answers a connection from outside.
func TestSandboxCannotJoinTheExemptUIDsFlows(t *testing.T) {
	testkit.RequireNamespaces(t)
	pod, up := testkit.NewNS(t, "ex-pod"), testkit.NewNS(t, "ex-up")
	require.NoError(t, netns.Veth(pod, "eth0", up, "eth0"))
	require.NoError(t, pod.IPBatch(
		[]string{"addr", "add", "198.18.7.2/24", "dev", "eth0"},
		[]string{"addr", "add", "fd00:7::2/64", "dev", "eth0", "nodad"},
	))
	require.NoError(t, up.IPBatch(
		[]string{"addr", "add", "198.18.7.1/24", "dev", "eth0"},
		[]string{"addr", "add", "fd00:7::1/64", "dev", "eth0", "nodad"},
	))
	r, err := SidecarRules{Table: netns.Unique("egress_ex"), NetNS: pod.Path()}.Apply()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })

	const sidecar, sandbox = DefaultExemptUID, 1000
	for _, tc := range []struct{ network, resolver, pod, local string }{
		{"udp4", "198.18.7.1", "198.18.7.2", "127.0.0.1"},
		{"udp6", "fd00:7::1", "fd00:7::2", "::1"},
	} {
		t.Run(tc.network, func(t *testing.T) {
			resolver := netip.AddrPortFrom(netip.MustParseAddr(tc.resolver), 53)
			// The upstream resolver answers whatever reaches it and
			// remembers it.
			upstream, err := udpAs(up, 0, tc.network, resolver)
			require.NoError(t, err)
			t.Cleanup(func() { upstream.Close() })
			reached := make(chan string, 16)
			go answer(upstream, reached)
			// The sidecar's DNS port, where the sandbox's DNS belongs.
			dnsPort, err := udpAs(pod, sidecar, tc.network, netip.AddrPortFrom(netip.MustParseAddr(tc.local), DefaultDNSPort))
			require.NoError(t, err)
			t.Cleanup(func() { dnsPort.Close() })
			redirected := make(chan string, 16)
			go answer(dnsPort, redirected)

			// The sidecar asks upstream, gets its answer, and closes.
			c, err := udpAs(pod, sidecar, tc.network, netip.AddrPortFrom(netip.MustParseAddr(tc.pod), 0))
			require.NoError(t, err)
			port := c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
			require.NoError(t, exchange(c, resolver, "sidecar"), "the exempt uid's query")
			assert.Equal(t, "sidecar", <-reached)
			require.NoError(t, c.Close())

			// The sandbox takes the port and speaks to the same
			// resolver: a packet of the sidecar's flow, dropped on
			// its way out.
			c, err = udpAs(pod, sandbox, tc.network, netip.AddrPortFrom(netip.MustParseAddr(tc.pod), port))
			require.NoError(t, err, "the sandbox binds the sidecar's closed port")
			_, err = c.WriteToUDPAddrPort([]byte("joined"), resolver)
			c.Close()
			assert.ErrorIs(t, err, unix.EPERM, "the sandbox's packet of the sidecar's flow left")
			// A fresh flow of the sandbox's, sent after it, is
			// redirected: once it is in, the joined packet had its
			// chance to arrive.
			c, err = udpAs(pod, sandbox, tc.network, netip.AddrPortFrom(netip.MustParseAddr(tc.pod), 0))
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, exchange(c, resolver, "fresh"), "the sandbox's own query")
			assert.Equal(t, "fresh", <-redirected, "the sandbox's query was not redirected")
			select {
			case got := <-reached:
				assert.Fail(t, "the sandbox reached the upstream resolver", "it got %q through the sidecar's flow", got)
			case <-time.After(200 * time.Millisecond):
			}

			// A server in the Pod still answers who connects to it.
			tcp := "tcp" + tc.network[3:]
			var ln net.Listener
			require.NoError(t, pod.Do(func() error {
				if err := unix.Setfsuid(sandbox); err != nil {
					return err
				}
				defer unix.Setfsuid(0)
				ln, err = net.Listen(tcp, net.JoinHostPort(tc.pod, "8080"))
				return err
			}))
			defer ln.Close()
			go func() {
				if s, err := ln.Accept(); err == nil {
					s.Write([]byte("served"))
					s.Close()
				}
			}()
			var client net.Conn
			require.NoError(t, up.Do(func() (err error) {
				client, err = net.DialTimeout(tcp, net.JoinHostPort(tc.pod, "8080"), 5*time.Second)
				return err
			}))
			defer client.Close()
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(client)
			assert.NoError(t, err, "the Pod's server did not answer")
			assert.Equal(t, "served", string(got))
		})
	}
}

// answer echoes every datagram c receives and reports it on got.
func answer(c *net.UDPConn, got chan<- string) {
	buf := make([]byte, 512)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		got <- string(buf[:n])
		c.WriteToUDPAddrPort(buf[:n], from)
	}
}

// exchange sends msg to addr from c and waits for it to be echoed.
func exchange(c *net.UDPConn, addr netip.AddrPort, msg string) error {
	if _, err := c.WriteToUDPAddrPort([]byte(msg), addr); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return err
	}
	if !bytes.Equal(buf[:n], []byte(msg)) {
		return fmt.Errorf("echoed %q, sent %q", buf[:n], msg)
	}
	return nil
}
