// Command mcpcall is the e2e check's MCP client: the official Go SDK's,
// over Streamable HTTP with net/http's default client (the environment's
// proxy, the system's roots), as an agent's tool runner would use it. It
// starts a session with the endpoint, calls each tool named in turn, and
// prints one line per call: the tool's text, or the error it got. It
// fails only if the session cannot start.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: mcpcall URL TOOL...")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: os.Args[1], MaxRetries: -1}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "session:", err)
		os.Exit(1)
	}
	defer session.Close()
	for _, tool := range os.Args[2:] {
		res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]string{"query": "e2e"}})
		switch {
		case err != nil:
			fmt.Printf("%s: error: %v\n", tool, err)
		case len(res.Content) == 0:
			fmt.Printf("%s: no content\n", tool)
		default:
			if text, ok := res.Content[0].(*mcp.TextContent); ok {
				fmt.Printf("%s: %s\n", tool, text.Text)
			}
		}
	}
}
