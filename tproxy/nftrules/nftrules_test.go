//go:build linux

package nftrules

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite golden files")

var testGateway = GatewayRules{
	Table: "egress_test",
	Links: []Link{
		{Interface: "veth-agent1", Addrs: []netip.Addr{netip.MustParseAddr("198.18.64.10"), netip.MustParseAddr("fd00:64::10")}},
		{Interface: "veth-agent2", Addrs: []netip.Addr{netip.MustParseAddr("198.18.65.10"), netip.MustParseAddr("fd00:64:1::10")}},
	},
	Sources:    []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:1::/64")},
	AgentPools: []netip.Prefix{netip.MustParsePrefix("198.18.64.0/18"), netip.MustParsePrefix("fd00:64::/48")},
	DNSPort:    15053,
	ProxyPort:  15001,
	OpenPorts:  []uint16{15002, 2222},
}

var testSidecar = SidecarRules{Table: "egress_test"}

// recordBatch builds rules on a connection that records the netlink
// messages instead of sending them, and returns them as hex lines without
// their headers (whose sequence numbers vary).
func recordBatch(t *testing.T, build func(*Rules) error) string {
	t.Helper()
	var msgs []netlink.Message
	r, err := openRules("", "egress_test", nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		msgs = append(msgs, req...)
		var acks []netlink.Message
		for _, m := range req {
			if m.Header.Flags&netlink.Acknowledge != 0 {
				acks = append(acks, netlink.Message{Header: netlink.Header{Length: 4, Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID}, Data: []byte{0, 0, 0, 0}})
			}
		}
		return acks, nil
	}))
	require.NoError(t, err)
	require.NoError(t, build(r))
	require.NoError(t, r.conn.Flush())
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(hex.EncodeToString(canonical(t, m)))
		b.WriteByte('\n')
	}
	return b.String()
}

// canonical is a message's data with the policy of a ct timeout object
// in the order of its attributes' types: the library writes it in the
// order of a map.
func canonical(t *testing.T, m netlink.Message) []byte {
	const newObj = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWOBJ)
	const nested, ctTimeoutData = unix.NLA_F_NESTED, 3 // NFTA_CT_TIMEOUT_DATA
	if m.Header.Type != newObj {
		return m.Data
	}
	// rewrite applies f to the data of the nested attribute typ in b.
	rewrite := func(b []byte, typ uint16, f func([]byte) []byte) []byte {
		attrs, err := netlink.UnmarshalAttributes(b)
		require.NoError(t, err)
		for i, a := range attrs {
			if a.Type == nested|typ {
				attrs[i].Data = f(a.Data)
			}
		}
		out, err := netlink.MarshalAttributes(attrs)
		require.NoError(t, err)
		return out
	}
	const header = 4 // struct nfgenmsg
	body := rewrite(m.Data[header:], unix.NFTA_OBJ_DATA, func(obj []byte) []byte {
		return rewrite(obj, ctTimeoutData, func(policy []byte) []byte {
			attrs, err := netlink.UnmarshalAttributes(policy)
			require.NoError(t, err)
			slices.SortFunc(attrs, func(a, b netlink.Attribute) int { return int(a.Type) - int(b.Type) })
			out, err := netlink.MarshalAttributes(attrs)
			require.NoError(t, err)
			return out
		})
	})
	return append(slices.Clone(m.Data[:header]), body...)
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	assert.Equal(t, string(want), got, "%s differs from the golden file", name)
}

// TestRulesetBytes checks, without root, the exact netlink batch each mode
// sends: one batch, beginning by replacing the table. The library numbers
// sets from one counter per process, so it runs before any test that
// builds gateway rules (tests run in the order of their files' names).
func TestRulesetBytes(t *testing.T) {
	checkGolden(t, "gateway.nlmsg.golden", recordBatch(t, testGateway.build))
	checkGolden(t, "sidecar.nlmsg.golden", recordBatch(t, func(r *Rules) error { testSidecar.build(r); return nil }))
}

var handles = regexp.MustCompile(` # handle \d+`)

// nftList returns `nft list ruleset` inside a namespace.
func nftList(t *testing.T, n *netns.NS) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("requires the nft command (apt-get install nftables)")
	}
	out, err := n.Run(context.Background(), "nft", "list", "ruleset")
	require.NoError(t, err)
	return handles.ReplaceAllString(out, "")
}

// TestRulesetInKernel installs both modes in a fresh namespace, compares
// what the kernel holds with golden `nft list ruleset` text, and checks
// that Close removes everything and that a second Apply replaces, rather
// than adds to, a table left by a crashed run.
func TestRulesetInKernel(t *testing.T) {
	testkit.RequireNamespaces(t)
	for _, tc := range []struct {
		name  string
		apply func(netnsPath string) (*Rules, error)
	}{
		{"gateway", func(p string) (*Rules, error) { g := testGateway; g.NetNS = p; return g.Apply() }},
		{"sidecar", func(p string) (*Rules, error) { s := testSidecar; s.NetNS = p; return s.Apply() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := testkit.NewNS(t, "nft")
			crashed, err := tc.apply(n.Path()) // left behind, as by a crash
			require.NoError(t, err)
			crashed.release()
			r, err := tc.apply(n.Path())
			require.NoError(t, err)
			checkGolden(t, tc.name+".nft.golden", nftList(t, n))
			if tc.name == "gateway" {
				require.NoError(t, r.AddLink(Link{Interface: "veth-agent3", Addrs: []netip.Addr{netip.MustParseAddr("198.18.66.10")}}))
				require.NoError(t, r.RemoveLink("veth-agent1"))
				out := nftList(t, n)
				assert.Contains(t, out, `"veth-agent3"`, "interface set not updated")
				assert.Contains(t, out, `"veth-agent3" . 198.18.66.10`, "pinned sources not updated")
				assert.NotContains(t, out, `"veth-agent1"`, "interface set not updated")
				assert.NotContains(t, out, `198.18.64.10`, "a removed link's sources stay pinned")
			}
			require.NoError(t, r.Close())
			assert.Empty(t, strings.TrimSpace(nftList(t, n)), "after Close the namespace still has rules")
			assert.NoError(t, r.Close(), "second Close")
		})
	}
}

func TestNoNetworkRules(t *testing.T) {
	testkit.RequireNamespaces(t)
	n := testkit.NewNS(t, "nft")
	r, err := GatewayRules{Table: "egress_test", NetNS: n.Path(), Links: []Link{{Interface: "veth-agent1"}}, NoNetwork: true, DNSPort: 15053, ProxyPort: 15001}.Apply()
	require.NoError(t, err)
	defer r.Close()
	out := nftList(t, n)
	require.NotContains(t, out, "redirect", "no-network rules")
	require.Contains(t, out, "chain agent_in {\n\t\tdrop\n\t}", "no-network rules")
	// The listeners may run all the same: the uplink side still reaches
	// none of them.
	require.Contains(t, out, "udp dport 15053 drop", "no-network rules")
	require.Contains(t, out, "tcp dport 15001 drop", "no-network rules")
}

// TestSourcePinning sends DNS from an agent's namespace to the gateway:
// from the agent's own addresses it arrives; from another address of its
// subnet, bound with IPV6_FREEBIND as any unprivileged process can, it is
// dropped before any socket sees it, and counted.
func TestSourcePinning(t *testing.T) {
	testkit.RequireNamespaces(t)
	gw, agent := testkit.NewNS(t, "pin-gw"), testkit.NewNS(t, "pin-ag")
	require.NoError(t, netns.Veth(gw, "agent0", agent, "eth0"))
	for _, step := range []struct {
		ns   *netns.NS
		args []string
	}{
		{gw, []string{"addr", "add", "198.18.0.1/24", "dev", "agent0"}},
		{gw, []string{"addr", "add", "fd00:aa::1/64", "dev", "agent0", "nodad"}},
		{agent, []string{"addr", "add", "198.18.0.10/24", "dev", "eth0"}},
		{agent, []string{"addr", "add", "fd00:aa::10/64", "dev", "eth0", "nodad"}},
	} {
		require.NoError(t, step.ns.IP(step.args...))
	}
	own4, own6 := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00:aa::10")
	r, err := GatewayRules{Table: "egress_pin", NetNS: gw.Path(), DNSPort: 15053, ProxyPort: 15001,
		Links: []Link{{Interface: "agent0", Addrs: []netip.Addr{own4, own6}}}}.Apply()
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })

	// The gateway's DNS port, which DNS to the gateway is redirected to.
	var pc net.PacketConn
	require.NoError(t, gw.Do(func() (err error) { pc, err = net.ListenPacket("udp", ":15053"); return err }))
	t.Cleanup(func() { pc.Close() })
	received := make(chan netip.Addr, 16)
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				close(received)
				return
			}
			ap := from.(*net.UDPAddr).AddrPort()
			received <- ap.Addr().Unmap()
		}
	}()
	send := func(from netip.Addr, to string) {
		t.Helper()
		require.NoError(t, agent.Do(func() error {
			var lc net.ListenConfig
			network := "udp4"
			if from.Is6() {
				network = "udp6"
				lc.Control = func(_, _ string, c syscall.RawConn) error {
					var serr error
					err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1) })
					return errors.Join(err, serr)
				}
			}
			c, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(from, 0).String())
			if err != nil {
				return err
			}
			defer c.Close()
			dst, err := net.ResolveUDPAddr(network, to)
			if err != nil {
				return err
			}
			_, err = c.WriteTo([]byte("query"), dst)
			return err
		}))
	}
	spoofed := netip.MustParseAddr("fd00:aa::99")
	send(spoofed, "[fd00:aa::1]:53")
	send(own6, "[fd00:aa::1]:53")
	send(own4, "198.18.0.1:53")
	var got []netip.Addr
	for len(got) < 2 {
		select {
		case a := <-received:
			got = append(got, a)
		case <-time.After(10 * time.Second):
			require.FailNow(t, "the agent's own queries did not arrive", "got %v", got)
		}
	}
	assert.ElementsMatch(t, []netip.Addr{own6, own4}, got, "sources that reached the DNS port")
	n, err := r.Spoofed()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "spoofed packets counted")

	// Once the link goes, its addresses are no longer admitted.
	require.NoError(t, r.RemoveLink("agent0"))
	require.NoError(t, r.AddLink(Link{Interface: "agent0", Addrs: []netip.Addr{own4}}))
	send(own6, "[fd00:aa::1]:53")
	send(own4, "198.18.0.1:53")
	select {
	case a := <-received:
		assert.Equal(t, own4, a, "a source the link no longer admits arrived")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the agent's IPv4 query did not arrive")
	}
	n, err = r.Spoofed()
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "spoofed packets counted")
}
