//go:build linux

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGatewayLinksTakeNoRoutes: the gateway's end of every agent's link
// takes no router advertisement and no redirect, so that a sandbox whose
// packet got past the rules still could not move the gateway's routes
// onto its link (TestAgentRouterAdvertisementIsRefused is the rules'
// half).
func TestGatewayLinksTakeNoRoutes(t *testing.T) {
	w := requireWorld(t)
	ctx := context.Background()
	agents := w.agentInfos(t)
	require.NotEmpty(t, agents)
	for _, a := range agents {
		out, err := w.gw.Run(ctx, "ip", "-o", "addr", "show", "to", a.Gateway4)
		require.NoError(t, err)
		fields := strings.Fields(out)
		require.GreaterOrEqual(t, len(fields), 2, "%s's link: %q", a.Name, out)
		iface := fields[1]
		for _, setting := range []string{"ipv6/conf/" + iface + "/accept_ra", "ipv6/conf/" + iface + "/accept_redirects", "ipv4/conf/" + iface + "/accept_redirects"} {
			got, err := w.gw.Run(ctx, "cat", "/proc/sys/net/"+setting)
			require.NoError(t, err)
			assert.Equal(t, "0", strings.TrimSpace(got), "%s: %s", a.Name, setting)
		}
	}
}
