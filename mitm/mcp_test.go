package mitm

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

type queryArgs struct {
	Query string `json:"query"`
}

// mcpServer is a test MCP server (the official SDK's) with two tools, on
// the rig's upstream at /mcp: search, which the policy allows, and exec.
func mcpServer(r *rig) {
	s := mcp.NewServer(&mcp.Implementation{Name: "test-tools", Version: "1"}, nil)
	for _, name := range []string{"search", "exec"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: name}, func(_ context.Context, _ *mcp.CallToolRequest, in queryArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " ran " + in.Query}}}, nil, nil
		})
	}
	// The test's internet is on loopback: the SDK's guard against DNS
	// rebinding, which refuses a name arriving there, is not for it.
	r.mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true}))
}

// TestMCPClientThroughInterception: an MCP client (the official SDK's,
// Streamable HTTP, HTTP/1.1 and HTTP/2) on an intercepted connection
// starts its session, lists the tools and calls the allowed one; the
// call to the other is refused with a JSON-RPC error and recorded with
// the tool's name, and the session goes on.
func TestMCPClientThroughInterception(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			r := newRig(t)
			mcpServer(r)
			r.ic.Resolver.(testkit.Resolver)["mcp.test"] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
			endpoint := fmt.Sprintf("https://mcp.test:%d/mcp", r.upPort)
			p, err := policy.New(policy.Config{Allow: []string{"mcp " + endpoint + " tools=search"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
			require.NoError(t, err)
			r.changed.Store(p)

			ctx := t.Context()
			client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
			session, err := client.Connect(ctx, &mcp.StreamableClientTransport{
				Endpoint: endpoint, HTTPClient: r.client(r.serveIntercepted("mcp.test"), h2), MaxRetries: -1,
			}, nil)
			require.NoError(t, err, "the session starts through the gateway")
			defer session.Close()

			tools, err := session.ListTools(ctx, nil)
			require.NoError(t, err)
			assert.Len(t, tools.Tools, 2, "the server lists both; the gateway judges calls")

			res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "search", Arguments: queryArgs{Query: "egress"}})
			require.NoError(t, err)
			require.Len(t, res.Content, 1)
			assert.Equal(t, "search ran egress", res.Content[0].(*mcp.TextContent).Text)

			_, err = session.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: queryArgs{Query: "rm -rf /"}})
			require.Error(t, err, "a tool the policy does not list was called")
			assert.Contains(t, err.Error(), "egress denied: "+policy.ReasonMCPTool, "the client is told why, as a JSON-RPC error")
			rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Tool == "exec" })
			assert.False(t, rec.Allowed)
			assert.Equal(t, policy.ReasonMCPTool, rec.Reason)
			assert.Equal(t, "mcp "+endpoint, rec.Rule)
			assert.Equal(t, http.StatusOK, rec.Status, "answered with a JSON-RPC error, so that the session goes on")

			res, err = session.CallTool(ctx, &mcp.CallToolParams{Name: "search", Arguments: queryArgs{Query: "again"}})
			require.NoError(t, err, "the session goes on after a refusal")
			assert.Equal(t, "search ran again", res.Content[0].(*mcp.TextContent).Text)
			rec = r.waitRecord(func(rec egresslog.Record) bool { return rec.Tool == "search" && rec.Allowed })
			assert.Equal(t, "/mcp", rec.Path)
		})
	}
}
