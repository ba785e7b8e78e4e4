package policy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mcpPolicy(t testing.TB) *Policy {
	p, err := New(Config{
		Allow: []string{"mcp https://mcp.example.com/mcp tools=search,fetch"},
		MCP:   []MCPEndpoint{{URL: "https://tools.example.com:8443/v1/mcp", Tools: []string{"lookup"}, Methods: []string{"initialize", "tools/list"}}},
	})
	require.NoError(t, err)
	return p
}

func call(name string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + name + `","arguments":{}}}`
}

// TestMCPMessages: each message posted to an MCP endpoint is judged;
// the ways to slip a call past a judge that reads JSON one way and a
// server another are refused.
func TestMCPMessages(t *testing.T) {
	p := mcpPolicy(t)
	for _, tc := range []struct {
		name, body, reason, tool string
	}{
		{"an allowed tool", call("search"), "", "search"},
		{"another allowed tool", call("fetch"), "", "fetch"},
		{"a tool not listed", call("exec"), ReasonMCPTool, "exec"},
		{"a batch, all allowed", "[" + call("search") + "," + call("fetch") + "]", "", "search,fetch"},
		{"a batch with one refused", "[" + call("search") + "," + call("exec") + "]", ReasonMCPTool, "search,exec"},
		{"an empty batch", "[]", ReasonMCPNotJSONRPC, ""},
		{"initialize (a default method)", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}`, "", ""},
		{"a notification (a default method)", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "", ""},
		{"a method not listed", `{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}`, ReasonMCPMethod, ""},
		{"a response to the server's request", `{"jsonrpc":"2.0","id":"s1","result":{"roots":[]}}`, "", ""},
		{"a response with result and error", `{"jsonrpc":"2.0","id":"s1","result":{},"error":{}}`, ReasonMCPNotJSONRPC, ""},
		{"no jsonrpc member", `{"id":1,"method":"tools/call","params":{"name":"search"}}`, ReasonMCPNotJSONRPC, ""},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"search"}}`, ReasonMCPNotJSONRPC, ""},
		{"not JSON", `tools/call exec`, ReasonMCPNotJSONRPC, ""},
		{"empty", ``, ReasonMCPNotJSONRPC, ""},
		{"a method that is not a string", `{"jsonrpc":"2.0","id":1,"method":["tools/call"]}`, ReasonMCPNotJSONRPC, ""},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["exec"]}`, ReasonMCPNotJSONRPC, ""},
		{"no tool name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`, ReasonMCPNotJSONRPC, ""},
		{"the name twice", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","name":"exec"}}`, ReasonMCPNotJSONRPC, ""},
		{"params twice", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec"},"params":{"name":"search"}}`, ReasonMCPNotJSONRPC, ""},
		{"Params beside params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec"},"Params":{"name":"search"}}`, ReasonMCPNotJSONRPC, ""},
		{"Name beside name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"Name":"exec","name":"search"}}`, ReasonMCPNotJSONRPC, ""},
		{"method twice", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"exec"}}`, ReasonMCPNotJSONRPC, ""},
		{"a second object after the first", call("search") + call("exec"), ReasonMCPNotJSONRPC, ""},
		{"a key encoding/json folds into params (U+017F)", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"},"paramſ":{"name":"exec"}}`, ReasonMCPNotJSONRPC, ""},
		{"a Kelvin sign folded into k", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","Key":1}}`, ReasonMCPNotJSONRPC, ""},
		{"Method alone, dressed as a response", `{"jsonrpc":"2.0","id":7,"error":{"code":0,"message":""},"Method":"tools/call","Params":{"name":"exec"}}`, ReasonMCPNotJSONRPC, ""},
		{"Name alone", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"Name":"exec"}}`, ReasonMCPNotJSONRPC, ""},
		{"an escaped name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\u0065xec"}}`, ReasonMCPTool, "exec"},
		{"a name differing in case", call("Search"), ReasonMCPTool, "Search"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "https://mcp.example.com/mcp", strings.NewReader(tc.body))
			d := p.DecideHTTP(r, "mcp.example.com", 443)
			assert.Equal(t, tc.reason == "", d.Allowed, "%+v", d)
			if tc.reason != "" {
				assert.Equal(t, tc.reason, d.Reason)
			}
			assert.Equal(t, tc.tool, d.Tool)
			assert.Equal(t, "mcp https://mcp.example.com/mcp", d.Rule)
			forwarded, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			assert.Equal(t, tc.body, string(forwarded), "the body goes on as it came")
			assert.EqualValues(t, len(tc.body), r.ContentLength)
		})
	}
}

func TestMCPEndpointRequests(t *testing.T) {
	p := mcpPolicy(t)
	for _, tc := range []struct {
		method, host string
		port         uint16
		path, body   string
		allowed      bool
		reason       string
	}{
		{"GET", "mcp.example.com", 443, "/mcp", "", true, ReasonAllowedByRule},    // the server's event stream
		{"DELETE", "mcp.example.com", 443, "/mcp", "", true, ReasonAllowedByRule}, // the session's end
		{"GET", "mcp.example.com", 443, "/mcp", call("exec"), false, ReasonMCPBodyUnjudged},
		{"DELETE", "mcp.example.com", 443, "/mcp", call("exec"), false, ReasonMCPBodyUnjudged},
		{"PUT", "mcp.example.com", 443, "/mcp", "", false, ReasonNoRequestRule},
		{"POST", "mcp.example.com", 443, "/other", call("search"), false, ReasonNoRequestRule},
		{"POST", "mcp.example.com", 443, "/mcp/../mcp", call("search"), false, ReasonPathDotSegment},
		{"POST", "mcp.example.com", 80, "/mcp", call("search"), false, ReasonPortNotListed},
		{"POST", "tools.example.com", 8443, "/v1/mcp", call("lookup"), true, ReasonAllowedByRule},
		{"POST", "tools.example.com", 8443, "/v1/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, false, ReasonMCPMethod}, // its own list
		{"POST", "tools.example.com", 8443, "/v1/mcp", "", false, ReasonMCPNotJSONRPC},
	} {
		r := httptest.NewRequest(tc.method, "https://"+tc.host+tc.path, strings.NewReader(tc.body))
		r.URL.RawPath = tc.path
		d := p.DecideHTTP(r, tc.host, tc.port)
		assert.Equal(t, tc.allowed, d.Allowed, "%s %s:%d%s %+v", tc.method, tc.host, tc.port, tc.path, d)
		assert.Equal(t, tc.reason, d.Reason, "%s %s:%d%s", tc.method, tc.host, tc.port, tc.path)
	}

	big := httptest.NewRequest("POST", "https://mcp.example.com/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"q":"`+strings.Repeat("x", MaxMCPBody)+`"}}}`))
	d := p.DecideHTTP(big, "mcp.example.com", 443)
	assert.False(t, d.Allowed)
	assert.Equal(t, ReasonMCPTooLarge, d.Reason)

	// Other hosts' requests are not read.
	open, err := New(Config{Mode: Open})
	require.NoError(t, err)
	r := httptest.NewRequest("POST", "https://example.com/mcp", strings.NewReader("not json"))
	body := r.Body
	assert.True(t, open.DecideHTTP(r, "example.com", 443).Allowed)
	assert.Equal(t, body, r.Body, "a body read that needed no judging")
}

func TestMCPEntryErrors(t *testing.T) {
	for _, tc := range []struct{ entry, want string }{
		{"mcp https://mcp.example.com/mcp", "names the tools"},
		{"mcp https://mcp.example.com/mcp tool=search", "takes tools=a,b"},
		{"mcp ftp://mcp.example.com/mcp tools=a", "http or https URL"},
		{"mcp https://user@mcp.example.com/mcp tools=a", "http or https URL"},
		{"mcp https://mcp.example.com/mcp?x=1 tools=a", "http or https URL"},
		{"mcp https://203.0.113.1/mcp tools=a", "must be a name"},
		{"mcp https://mcp.example.com/** tools=a", "one path"},
	} {
		_, err := New(Config{Allow: []string{tc.entry}})
		if assert.Error(t, err, tc.entry) {
			assert.Contains(t, err.Error(), tc.want, tc.entry)
		}
	}
}

// FuzzMCPMessages: no body panics the judge, and a body it allows calls
// only listed tools.
func FuzzMCPMessages(f *testing.F) {
	for _, s := range []string{call("search"), "[" + call("search") + "," + call("exec") + "]", `{"jsonrpc":"2.0","id":"x","result":{}}`, `{"jsonrpc":"2.0","method":"ping"}`, `[]`, `{`, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec"},"Params":{}}`} {
		f.Add(s)
	}
	rule := &mcpRule{tools: []string{"search"}, methods: DefaultMCPMethods}
	f.Fuzz(func(t *testing.T, body string) {
		tools, why := rule.judge(readMessages([]byte(body)))
		if why == "" {
			for _, tool := range tools {
				require.Equal(t, "search", tool, "allowed %q", body)
			}
		}
	})
}

// TestMCPRefusalIsAJSONRPCError: a refused message is answered with a
// JSON-RPC error for each request in it, so that the client's session
// goes on; a body with no request to answer gets none (an HTTP refusal).
func TestMCPRefusalIsAJSONRPCError(t *testing.T) {
	p := mcpPolicy(t)
	for _, tc := range []struct{ body, reply string }{
		{call("exec"), `{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"egress denied: the MCP tool is not allowed"}}`},
		{`[` + call("search") + `,{"jsonrpc":"2.0","method":"notifications/progress"},{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"exec"}}]`,
			`[{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"egress denied: the MCP method is not allowed"}},{"jsonrpc":"2.0","id":"b","error":{"code":-32001,"message":"egress denied: the MCP method is not allowed"}}]`},
		{`{"jsonrpc":"2.0","method":"notifications/progress"}`, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec"},"Params":{}}`, ""},
	} {
		r := httptest.NewRequest("POST", "https://mcp.example.com/mcp", strings.NewReader(tc.body))
		d := p.DecideHTTP(r, "mcp.example.com", 443)
		assert.False(t, d.Allowed, tc.body)
		assert.Equal(t, tc.reply, d.JSONRPCReply, tc.body)
	}
}

// TestRequestJudgementHolesClosed: what else could carry a request past
// its entries is judged or refused: a method override, an upgrade of an
// MCP endpoint, an entry that allows an MCP endpoint's host in full.
func TestRequestJudgementHolesClosed(t *testing.T) {
	p, err := New(Config{Allow: []string{
		"GET,POST api.test/items/*", "!DELETE api.test/**",
		"*.example.com", "mcp https://mcp.example.com/mcp tools=search", "POST mcp2.example.com/mcp",
		"mcp https://mcp2.example.com/mcp tools=search",
	}})
	require.NoError(t, err)
	post := func(host, target, body string, header ...string) Decision {
		r := httptest.NewRequest("POST", "https://"+host+target, strings.NewReader(body))
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return p.DecideHTTP(r, host, 443)
	}
	assert.True(t, post("api.test", "/items/1", "").Allowed)
	for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"} {
		d := post("api.test", "/items/1", "", h, "delete")
		assert.False(t, d.Allowed, h)
		assert.Equal(t, "!DELETE api.test/**", d.Rule, h)
	}
	assert.False(t, post("api.test", "/items/1?_method=DELETE", "").Allowed, "_method in the query")
	assert.False(t, post("api.test", "/items/1", "", "X-HTTP-Method-Override", "PUT").Allowed, "an override no entry allows")

	// The MCP endpoint's entry holds though *.example.com allows the host.
	assert.True(t, p.Decide("mcp.example.com", 443).Requests, "its requests must be seen")
	d := post("mcp.example.com", "/mcp", call("exec"))
	assert.False(t, d.Allowed)
	assert.Equal(t, ReasonMCPTool, d.Reason)
	d = post("mcp2.example.com", "/mcp", call("exec"))
	assert.False(t, d.Allowed, "a plain request entry for the same path does not shadow the MCP entry")
	r := httptest.NewRequest("PUT", "https://mcp.example.com/mcp", nil)
	assert.False(t, p.DecideHTTP(r, "mcp.example.com", 443).Allowed, "only the endpoint's methods")
	assert.True(t, post("mcp.example.com", "/other", "anything").Allowed, "the rest of the host is *.example.com's")

	r = httptest.NewRequest("GET", "https://mcp.example.com/mcp", nil)
	r.Header.Set("Upgrade", "websocket")
	r.Header.Set("Connection", "Upgrade")
	d = p.DecideHTTP(r, "mcp.example.com", 443)
	assert.False(t, d.Allowed)
	assert.Equal(t, ReasonMCPUpgrade, d.Reason)

	assert.True(t, p.JudgesRequests("API.test.", 443))
	assert.True(t, p.JudgesRequests("mcp.example.com", 443))
	assert.False(t, p.JudgesRequests("www.example.com", 443))
}

// TestMCPBodyInOneReading: a message is judged only when its bytes are
// what a server reads: UTF-8 JSON, in no content coding. In UTF-7 (which
// body-parser, the TypeScript SDK's, decodes), bytes the judge reads as
// one string's contents are JSON of their own, a second tool name among
// them; a coding hides the message from the judge.
func TestMCPBodyInOneReading(t *testing.T) {
	p := mcpPolicy(t)
	for _, tc := range []struct {
		header  http.Header
		allowed bool
	}{
		{http.Header{}, true},
		{http.Header{"Content-Type": {"application/json"}}, true},
		{http.Header{"Content-Type": {"application/json; charset=utf-8"}}, true},
		{http.Header{"Content-Type": {"application/json; charset=UTF8"}}, true},
		{http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"identity"}}, true},
		{http.Header{"Content-Type": {"application/json; charset=utf-7"}}, false},
		{http.Header{"Content-Type": {"application/json; charset=UTF-7-IMAP"}}, false},
		{http.Header{"Content-Type": {"application/json; charset=iso-8859-1"}}, false},
		{http.Header{"Content-Type": {"application/json; charset*=utf-8''utf-7"}}, false},
		{http.Header{"Content-Type": {"application/json; charset=utf-8; charset=utf-7"}}, false},
		{http.Header{"Content-Type": {"application/json", "application/json; charset=utf-7"}}, false},
		{http.Header{"Content-Type": {"application/json; charset"}}, false},
		{http.Header{"Content-Encoding": {"gzip"}}, false},
		{http.Header{"Content-Encoding": {"identity, br"}}, false},
		{http.Header{"Content-Encoding": {"identity", "zstd"}}, false},
	} {
		r := httptest.NewRequest("POST", "https://mcp.example.com/mcp", strings.NewReader(call("search")))
		r.Header = tc.header
		d := p.DecideHTTP(r, "mcp.example.com", 443)
		assert.Equal(t, tc.allowed, d.Allowed, "%v: %+v", tc.header, d)
		if !tc.allowed {
			assert.Equal(t, ReasonMCPEncoded, d.Reason, "%v", tc.header)
		}
	}
}

// TestMCPEndpointInAnyReading: an MCP endpoint is judged at every path a
// server may take for it (another letter case, a trailing slash, an
// encoded slash), though another entry allows its host in full; an
// endpoint written in capitals is found as it is written too.
func TestMCPEndpointInAnyReading(t *testing.T) {
	for _, allow := range [][]string{
		{"*.example.com", "mcp https://mcp.example.com/v1/mcp tools=search"},
		{"*", "mcp https://mcp.example.com/v1/mcp tools=search"},
		{"mcp.example.com", "mcp https://mcp.example.com/V1/Mcp tools=search"},
	} {
		p, err := New(Config{Allow: allow})
		require.NoError(t, err)
		for _, path := range []string{"/v1/mcp", "/V1/MCP", "/v1/Mcp/", "/V1/Mcp", "/v1%2Fmcp", "/v1%2fMCP/"} {
			r := httptest.NewRequest("POST", "https://mcp.example.com/", strings.NewReader(call("exec")))
			r.URL.RawPath, r.URL.Path = path, strings.NewReplacer("%2F", "/", "%2f", "/").Replace(path)
			d := p.DecideHTTP(r, "mcp.example.com", 443)
			assert.False(t, d.Allowed, "%v: POST %s: %+v", allow, path, d)
			assert.Equal(t, ReasonMCPTool, d.Reason, "%v: POST %s", allow, path)
		}
	}
	open, err := New(Config{Mode: Open, Allow: []string{"mcp https://mcp.example.com/v1/mcp tools=search"}})
	require.NoError(t, err)
	r := httptest.NewRequest("POST", "https://mcp.example.com/V1/MCP", strings.NewReader(call("exec")))
	assert.Equal(t, ReasonMCPTool, open.DecideHTTP(r, "mcp.example.com", 443).Reason, "in open mode")
}
