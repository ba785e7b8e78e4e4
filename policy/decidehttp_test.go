package policy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDecideAgain: a request judged by DecideHTTP is judged again, by
// another policy, by everything DecideHTTP read of it, its body gone on:
// its host, method, path, override methods and MCP messages.
func TestDecideAgain(t *testing.T) {
	policyOf := func(entries ...string) *Policy {
		p, err := New(Config{Allow: entries})
		require.NoError(t, err)
		return p
	}
	type request struct {
		method, url, body string
		header            []string
	}
	mcpCall := request{method: "POST", url: "https://mcp.example.com/mcp", body: call("search")}
	for _, tc := range []struct {
		name        string
		req         request
		first, then *Policy
		reason      string // "" if allowed again
	}{
		{"an MCP tool still allowed", mcpCall,
			policyOf("mcp https://mcp.example.com/mcp tools=search,fetch"), policyOf("mcp https://mcp.example.com/mcp tools=search"), ""},
		{"an MCP tool no longer allowed", mcpCall,
			policyOf("mcp https://mcp.example.com/mcp tools=search,fetch"), policyOf("mcp https://mcp.example.com/mcp tools=fetch"), ReasonMCPTool},
		{"a method no longer allowed on the endpoint",
			request{method: "POST", url: "https://mcp.example.com/mcp", body: `{"jsonrpc":"2.0","id":0,"method":"tools/list"}`},
			policyOf("mcp https://mcp.example.com/mcp tools=search"), policyOf("mcp https://mcp.example.com/mcp tools=search methods=initialize"), ReasonMCPMethod},
		{"one message of a batch no longer allowed",
			request{method: "POST", url: "https://mcp.example.com/mcp", body: "[" + call("search") + "," + call("fetch") + "]"},
			policyOf("mcp https://mcp.example.com/mcp tools=search,fetch"), policyOf("mcp https://mcp.example.com/mcp tools=search"), ReasonMCPTool},
		{"an endpoint whose messages were not read", mcpCall,
			policyOf("mcp.example.com"), policyOf("mcp https://mcp.example.com/mcp tools=search"), ReasonMCPNotRead},
		{"an endpoint no longer judged by its messages", mcpCall,
			policyOf("mcp https://mcp.example.com/mcp tools=search"), policyOf("mcp.example.com"), ""},
		{"the host no longer allowed", mcpCall,
			policyOf("mcp https://mcp.example.com/mcp tools=search"), policyOf("other.example.com"), ReasonNoRule},
		{"an override method now denied",
			request{method: "POST", url: "https://api.test/items/1", header: []string{"X-HTTP-Method-Override", "DELETE"}},
			policyOf("POST,DELETE api.test/items/*"), policyOf("POST,DELETE api.test/items/*", "!DELETE api.test/**"), ReasonDenyEntry},
		{"a path now denied",
			request{method: "GET", url: "https://api.test/items/1"},
			policyOf("api.test"), policyOf("api.test", "!GET api.test/items/*"), ReasonDenyEntry},
		{"a path still allowed",
			request{method: "GET", url: "https://api.test/items/1"},
			policyOf("api.test"), policyOf("GET api.test/items/**"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.req.method, tc.req.url, strings.NewReader(tc.req.body))
			for i := 0; i+1 < len(tc.req.header); i += 2 {
				r.Header.Set(tc.req.header[i], tc.req.header[i+1])
			}
			host := r.URL.Hostname()
			d := tc.first.DecideHTTP(r, host, 443)
			require.True(t, d.Allowed, "%+v", d)
			again := tc.then.DecideAgain(d)
			assert.Equal(t, tc.reason == "", again.Allowed, "%+v", again)
			assert.Equal(t, tc.reason, map[bool]string{true: "", false: again.Reason}[again.Allowed])
			assert.Equal(t, d, tc.first.DecideAgain(d), "by the policy that judged it, the same decision")
		})
	}
}

// TestDecideAgainFailsClosed: what DecideHTTP did not decide, or no
// policy, is refused; a policy in report mode reports.
func TestDecideAgainFailsClosed(t *testing.T) {
	p, err := New(Config{Allow: []string{"mcp https://mcp.example.com/mcp tools=search,fetch"}})
	require.NoError(t, err)
	d := p.DecideHTTP(httptest.NewRequest("POST", "https://mcp.example.com/mcp", strings.NewReader(call("fetch"))), "mcp.example.com", 443)
	require.True(t, d.Allowed)

	assert.Equal(t, Decision{Reason: ReasonNotJudged}, p.DecideAgain(p.Decide("mcp.example.com", 443)))
	assert.Equal(t, Decision{Reason: ReasonNoPolicy}, (*Policy)(nil).DecideAgain(d))

	report, err := New(Config{Report: true, Allow: []string{"mcp https://mcp.example.com/mcp tools=search"}})
	require.NoError(t, err)
	again := report.DecideAgain(d)
	assert.True(t, again.Allowed && again.Report, "%+v", again)
	assert.Equal(t, ReasonMCPTool, again.Reason)
}

// TestDecideAgainHoldsLittle: what a request holds to be judged again is
// bounded by the methods and tools it names, not by its body: a batch of
// a thousand calls of one tool holds one.
func TestDecideAgainHoldsLittle(t *testing.T) {
	p, err := New(Config{Allow: []string{"mcp https://mcp.example.com/mcp tools=search,fetch"}})
	require.NoError(t, err)
	batch := "[" + strings.Repeat(call("search")+",", 1000) + call("fetch") + "]"
	d := p.DecideHTTP(httptest.NewRequest("POST", "https://mcp.example.com/mcp", strings.NewReader(batch)), "mcp.example.com", 443)
	require.True(t, d.Allowed, "%+v", d)
	assert.Equal(t, "search,fetch", d.Tool)
	assert.Len(t, d.request.messages, 2)

	fetchOnly, err := New(Config{Allow: []string{"mcp https://mcp.example.com/mcp tools=fetch"}})
	require.NoError(t, err)
	again := fetchOnly.DecideAgain(d)
	assert.False(t, again.Allowed)
	assert.Equal(t, ReasonMCPTool, again.Reason)
	assert.Equal(t, "search", again.Tool)
}

// FuzzDecideAgain: judged again by the policy that judged it, any
// request is decided as it was the first time.
func FuzzDecideAgain(f *testing.F) {
	for _, s := range []string{call("search"), "[" + call("search") + "," + call("exec") + "]", `{"jsonrpc":"2.0","method":"ping"}`, `[]`, `{`, ""} {
		f.Add("POST", "/mcp", "", s)
	}
	f.Add("GET", "/mcp", "websocket", "")
	f.Add("DELETE", "/items/1", "", "x")
	p, err := New(Config{Allow: []string{"mcp https://mcp.example.com/mcp tools=search", "GET,POST mcp.example.com/items/*", "!DELETE mcp.example.com/**"}})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, method, path, upgrade, body string) {
		r, err := http.NewRequest(method, "https://mcp.example.com/", strings.NewReader(body))
		if err != nil {
			return
		}
		r.URL.Path = path
		if upgrade != "" {
			r.Header.Set("Upgrade", upgrade)
		}
		d := p.DecideHTTP(r, "mcp.example.com", 443)
		again := p.DecideAgain(d)
		assert.Equal(t, d.Allowed, again.Allowed, "%+v", d)
		assert.Equal(t, d.Reason, again.Reason)
		assert.Equal(t, d.Tool, again.Tool)
		assert.Equal(t, d.Rule, again.Rule)
	})
}
