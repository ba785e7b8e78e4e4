package policyfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name       string
		doc        string
		wantErr    string // "" means no error
		denyReason string // "" means not deny-all
		github443  bool
	}{
		{"allowlist", "enforce: true\nallowOut: [github.com]\n", "", "", true},
		{"allow alias", "enforce: true\nallow: [github.com]\n", "", "", true},
		{"json", `{"enforce": true, "mode": "allowlist", "allowOut": ["github.com"]}`, "", "", true},
		{"open", "enforce: true\nmode: open\n", "", "", true},
		{"version 1", "version: 1\nenforce: true\nallowOut: [github.com]\n", "", "", true},
		{"default mode is allowlist", "enforce: true\n", "", "", false},
		{"enforce false", "enforce: false\nmode: open\n", "", policy.ReasonNotEnforced, false},
		{"enforce unset", "mode: open\n", "", policy.ReasonEnforceUnset, false},
		{"empty", "", "empty", ReasonFileEmpty, false},
		{"whitespace", " \n\t\n", "empty", ReasonFileEmpty, false},
		{"comment only", "# nothing yet\n", "empty", ReasonFileEmpty, false},
		{"garbage", "\x00\x01\x02{{{", "parse", ReasonFileInvalid, false},
		{"unknown key", "enforce: true\nallowout: [github.com]\n", "allowout", ReasonFileInvalid, false},
		{"duplicate key", "enforce: true\nenforce: false\n", "parse", ReasonFileInvalid, false},
		{"enforce not bool", "enforce: sure\n", "parse", ReasonFileInvalid, false},
		{"allowOut not a list", "enforce: true\nallowOut: github.com\n", "parse", ReasonFileInvalid, false},
		{"bad entry", "enforce: true\nallowOut: [github.com, '*.com']\n", `"*.com"`, ReasonFileInvalid, false},
		{"bad mode", "enforce: true\nmode: permissive\n", "unknown mode", ReasonFileInvalid, false},
		{"bad version", "version: 2\nenforce: true\n", "version 2", ReasonFileInvalid, false},
		{"both lists", "enforce: true\nallow: [a.example]\nallowOut: [b.example]\n", "use one", ReasonFileInvalid, false},
		{"old spelling", "enforce: true\nallow-private-networks: true\n", "allowPrivateNetworks", ReasonFileInvalid, false},
		{"two documents", "enforce: true\nmode: open\n---\nenforce: false\n", "more than one", ReasonFileInvalid, false},
		{"too large", "enforce: true\nallowOut: [" + strings.Repeat("a.example, ", MaxDocumentSize/10) + "]\n", "larger than", ReasonFileInvalid, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse([]byte(tt.doc))
			require.NotNil(t, p, "Parse returned a nil policy")
			if tt.wantErr == "" {
				require.NoError(t, err, "Parse")
			} else {
				require.ErrorContains(t, err, tt.wantErr, "Parse")
			}
			assert.Equal(t, tt.denyReason, p.DenyReason(), "DenyReason()")
			d := p.Decide("github.com", 443)
			assert.Equal(t, tt.github443, d.Allowed, "Decide(github.com, 443) = %+v", d)
		})
	}
}

func TestParsePrivateNetworks(t *testing.T) {
	p, err := Parse([]byte("enforce: true\nallowOut: ['*']\nallowPrivateNetworks: true\n"))
	assert.NoError(t, err)
	assert.True(t, p.AllowPrivateNetworks(), "private networks not allowed")
	p, err = Parse([]byte("enforce: true\nallowOut: ['*']\n"))
	assert.NoError(t, err, "Parse without the switch")
	assert.False(t, p.AllowPrivateNetworks(), "private networks allowed without the switch")
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p, err := Load(filepath.Join(dir, "absent.yaml"))
	assert.Error(t, err, "absent file")
	assert.Equal(t, ReasonFileAbsent, p.DenyReason(), "absent file")
	p, err = Load(dir) // a directory cannot be read as a file
	assert.Error(t, err, "directory")
	assert.Equal(t, ReasonFileUnread, p.DenyReason(), "directory")
	path := filepath.Join(dir, "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte("enforce: true\nallowOut: [github.com]\n"), 0o600))
	p, err = Load(path)
	assert.NoError(t, err, "good file")
	assert.True(t, p.Decide("github.com", 443).Allowed, "good file: github.com:443 not allowed")
	require.NoError(t, os.WriteFile(path, []byte("enforce: [\n"), 0o600))
	p, err = Load(path)
	assert.ErrorContains(t, err, path, "bad file: the error names the file")
	assert.Equal(t, ReasonFileInvalid, p.DenyReason(), "bad file")
}

func TestQuotasFromDocument(t *testing.T) {
	p, err := Parse([]byte("enforce: true\nallowOut: [api.test]\nquotas:\n  dnsQueriesPerSecond: 7\n"))
	require.NoError(t, err)
	assert.EqualValues(t, 7, p.Quotas().DNSQueriesPerSecond)
	for _, doc := range []string{
		"enforce: true\nquotas:\n  dnsQueriesPerSecnd: 7\n", // misspelt
		"enforce: true\nquotas:\n  connectionsPerSecond: .nan\n",
	} {
		p, err := Parse([]byte(doc))
		assert.Error(t, err, "%q", doc)
		assert.False(t, p.Decide("api.test", 443).Allowed, "%q: a bad quota denies", doc)
	}
}

// TestUnknownKeySuggested: a key in another spelling than the document's
// (the kebab-case of older files) is an error that names the right one.
func TestUnknownKeySuggested(t *testing.T) {
	for doc, want := range map[string]string{
		"enforce: true\nallow-private-networks: true\n":         `"allow-private-networks" is spelt "allowPrivateNetworks"`,
		"enforce: true\ndoh-endpoints: [doh.example]\n":         `"doh-endpoints" is spelt "dohEndpoints"`,
		"enforce: true\nquotas:\n  dns_queries_per_second: 7\n": `"dns_queries_per_second" is spelt "dnsQueriesPerSecond"`,
	} {
		p, err := Parse([]byte(doc))
		require.Error(t, err, doc)
		assert.Contains(t, err.Error(), want)
		assert.Equal(t, ReasonFileInvalid, p.Decide("github.com", 443).Reason, "an unknown key denies")
	}
	_, err := Decode([]byte("enforce: true\ndoh-endpoints: [x.example]\n"))
	require.Error(t, err, "Decode is as strict as Parse")
	assert.Contains(t, err.Error(), `"dohEndpoints"`)
	_, err = Parse([]byte("enforce: true\nwhatever: 1\n"))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "is spelt", "a key like no other gets no suggestion")
}

// TestRequestEntriesFromDocument: request entries are allow and deny
// entries like any other, and MCP endpoints have a key of their own
// whose members are checked like the rest.
func TestRequestEntriesFromDocument(t *testing.T) {
	p, err := Parse([]byte(`enforce: true
allowOut:
  - GET,HEAD api.github.com/repos/acme/*
deny:
  - DELETE *.github.com/**
mcp:
  - url: https://mcp.example.com/mcp
    tools: [search]
`))
	require.NoError(t, err)
	assert.True(t, p.DecideRequest("api.github.com", 443, "GET", "/repos/acme/widgets").Allowed)
	assert.False(t, p.DecideRequest("api.github.com", 443, "DELETE", "/repos/acme/widgets").Allowed)
	assert.Equal(t, "mcp https://mcp.example.com/mcp", p.DecideRequest("mcp.example.com", 443, "GET", "/mcp").Rule)

	_, err = Parse([]byte("enforce: true\nmcp:\n  - url: https://mcp.example.com/mcp\n    tool: [search]\n"))
	require.Error(t, err, "a misspelt key of an MCP endpoint")
}
