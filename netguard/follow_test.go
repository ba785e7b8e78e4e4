//go:build linux

package netguard

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
)

// TestFollowLocalHelper is not a test: it is the gateway process that
// TestAddressGainedLaterIsNeverDialled starts inside its namespace, so
// that the process follows that namespace's addresses. It classifies
// each address it reads from its input.
func TestFollowLocalHelper(t *testing.T) {
	if os.Getenv("NETGUARD_TEST_FOLLOW") == "" {
		t.Skip("the gateway process of TestAddressGainedLaterIsNeverDialled; not run on its own")
	}
	g, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd00::/8")}})
	require.NoError(t, err)
	require.NoError(t, g.FollowLocal(t.Context()))
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Println(g.Classify(netip.MustParseAddr(in.Text())))
	}
}

// TestAddressGainedLaterIsNeverDialled: an address the gateway's host
// gains after the Guard was made (an operator's ip addr add, a DHCP
// lease) is the gateway's own as soon as the kernel announces it, and a
// sandbox cannot reach the gateway's services on it; an address the host
// loses is an ordinary destination again.
func TestAddressGainedLaterIsNeverDialled(t *testing.T) {
	testkit.RequireNamespaces(t)
	ns := testkit.NewNS(t, "ng-own")
	require.NoError(t, ns.IP("link", "set", "lo", "up"))
	exe, err := os.Executable()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := ns.Command(ctx, exe, "-test.run=^TestFollowLocalHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NETGUARD_TEST_FOLLOW=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewReader(stdout)
	ready, err := out.ReadString('\n')
	require.NoError(t, err, "the helper did not get ready")
	require.Equal(t, "READY\n", ready)
	classify := func(a string) string {
		_, err := fmt.Fprintln(stdin, a)
		require.NoError(t, err)
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		return strings.TrimSpace(line)
	}
	// eventually is what the helper says of a once it says want, or
	// the last it said after two seconds.
	eventually := func(a, want string) string {
		var got string
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got = classify(a); strings.HasPrefix(got, want) {
				break
			}
		}
		return got
	}

	addrs := []string{"198.18.42.1", "fd00:42::1"}
	for _, a := range addrs {
		require.True(t, strings.HasPrefix(classify(a), "public"), "%s before the host has it", a)
	}
	for _, a := range addrs {
		require.NoError(t, ns.IP("addr", "add", a, "dev", "lo"))
	}
	for _, a := range addrs {
		got := eventually(a, "never")
		assert.True(t, strings.HasPrefix(got, "never: the gateway's own address"), "%s, added to the host: %s", a, got)
	}
	for _, a := range addrs {
		require.NoError(t, ns.IP("addr", "del", a, "dev", "lo"))
	}
	for _, a := range addrs {
		got := eventually(a, "public")
		assert.True(t, strings.HasPrefix(got, "public"), "%s, gone from the host: %s", a, got)
	}
}
