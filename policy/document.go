package policy

import (
	"errors"
	"fmt"
)

// Document is a policy as a file holds it (package policyfile reads and
// watches one), in YAML or JSON, its keys in camelCase, the convention of
// the Kubernetes objects it usually lives in:
//
//	version: 1                   # optional; 1 is the only version
//	enforce: true                # anything but true denies everything
//	mode: allowlist              # allowlist (default), open, deny, or ask (an allowlist
//	                             # that asks about other names; see policy.Ask)
//	allowOut:                    # or "allow"
//	  - github.com
//	  - "*.npmjs.org"
//	  - 203.0.113.0/24:443
//	allowPrivateNetworks: false
//	deny:                        # wins over allow entries and open mode;
//	  - pastebin.com             # no port: every port (also "!pastebin.com" in allow)
//	  - "*.ngrok.io"
//	dohEndpoints: [doh.example]  # added to the built-in DNS-over-HTTPS list
//	mcp:                         # MCP endpoints and the tools they allow
//	  - url: https://mcp.example.com/mcp
//	    tools: [search, fetch]
//	    methods: [initialize, notifications/initialized, tools/list]  # optional
//	report: false                # dry run: log what enforce would deny
//	quotas:                      # per agent; 0 or absent: the default, -1: none
//	  connectionsPerSecond: 500
//	  dnsQueriesPerSecond: 500
//	  bytesPerSecondUp: 0        # 0: no limit
//	  bytesPerSecondDown: 0
//
// Unknown keys are errors, so a typo never silently loosens or tightens a
// policy, and a newer control plane's document denies on an older reader
// instead of being half understood.
type Document struct {
	Version              int           `yaml:"version" json:"version,omitempty"`
	Enforce              *bool         `yaml:"enforce" json:"enforce"`
	Mode                 string        `yaml:"mode" json:"mode,omitempty"`
	Allow                []string      `yaml:"allow" json:"allow,omitempty"`
	AllowOut             []string      `yaml:"allowOut" json:"allowOut,omitempty"`
	AllowPrivateNetworks bool          `yaml:"allowPrivateNetworks" json:"allowPrivateNetworks,omitempty"`
	Report               bool          `yaml:"report" json:"report,omitempty"`
	Quotas               Quotas        `yaml:"quotas" json:"quotas,omitzero"`
	Deny                 []string      `yaml:"deny" json:"deny,omitempty"`
	DoHEndpoints         []string      `yaml:"dohEndpoints" json:"dohEndpoints,omitempty"`
	MCP                  []MCPEndpoint `yaml:"mcp" json:"mcp,omitempty"`
}

// Reasons for the deny-all policies a document compiles to.
const (
	ReasonNotEnforced  = "policy enforce is false"
	ReasonEnforceUnset = "policy enforce is not set"
)

// Compile turns a document into a policy. A document that does not say
// enforce: true yields a deny-all policy and no error.
func (d *Document) Compile() (*Policy, error) {
	if d.Version != 0 && d.Version != 1 {
		return nil, fmt.Errorf("policy: unsupported version %d", d.Version)
	}
	if d.Enforce == nil {
		return Deny(ReasonEnforceUnset), nil
	}
	if !*d.Enforce {
		return Deny(ReasonNotEnforced), nil
	}
	mode, ask := Allowlist, false
	if d.Mode != "" {
		m, a, err := ParseModeWithAsk(d.Mode)
		if err != nil {
			return nil, err
		}
		mode, ask = m, a
	}
	if d.Allow != nil && d.AllowOut != nil {
		return nil, errors.New(`policy: both "allow" and "allowOut" are set; use one`)
	}
	return New(Config{
		Mode:                 mode,
		Allow:                append(d.Allow, d.AllowOut...),
		AllowPrivateNetworks: d.AllowPrivateNetworks,
		Report:               d.Report,
		Quotas:               d.Quotas,
		Deny:                 d.Deny,
		DoHEndpoints:         d.DoHEndpoints,
		MCP:                  d.MCP,
		Ask:                  ask,
	})
}
