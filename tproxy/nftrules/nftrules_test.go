//go:build linux

package nftrules

import (
	"context"
	"encoding/hex"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/netns"
	"github.com/agenthold/egress/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite golden files")

var testGateway = GatewayRules{
	Table:      "egress_test",
	Interfaces: []string{"veth-agent1", "veth-agent2"},
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
		b.WriteString(hex.EncodeToString(m.Data))
		b.WriteByte('\n')
	}
	return b.String()
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
// sends: one batch, beginning by replacing the table.
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
				require.NoError(t, r.AddInterface("veth-agent3"))
				require.NoError(t, r.RemoveInterface("veth-agent1"))
				out := nftList(t, n)
				assert.Contains(t, out, `"veth-agent3"`, "interface set not updated")
				assert.NotContains(t, out, `"veth-agent1"`, "interface set not updated")
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
	r, err := GatewayRules{Table: "egress_test", NetNS: n.Path(), Interfaces: []string{"veth-agent1"}, NoNetwork: true, DNSPort: 15053, ProxyPort: 15001}.Apply()
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
