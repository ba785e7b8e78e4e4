package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"go.yaml.in/yaml/v3"
)

// Document is the policy file, in YAML or JSON:
//
//	version: 1                    # optional; 1 is the only version
//	enforce: true                 # anything but true denies everything
//	mode: allowlist               # allowlist (default), open or deny
//	allowOut:                     # or "allow"
//	  - github.com
//	  - "*.npmjs.org"
//	  - 203.0.113.0/24:443
//	allow-private-networks: false # or allowPrivateNetworks
//	deny:                         # wins over allow entries and open mode;
//	  - pastebin.com              # no port: every port (also "!pastebin.com" in allow)
//	  - "*.ngrok.io"
//	doh-endpoints: [doh.example]  # added to the built-in DNS-over-HTTPS list
//	report: false                 # dry run: log what enforce would deny
//	quotas:                       # per agent; 0 or absent: the default, -1: none
//	  connections-per-second: 500
//	  dns-queries-per-second: 500
//	  bytes-per-second-up: 0      # 0: no limit
//	  bytes-per-second-down: 0
//
// Unknown keys are errors, so a typo never silently loosens or tightens a
// policy, and a newer control plane's document denies on an older reader
// instead of being half understood.
type Document struct {
	Version              int      `yaml:"version" json:"version,omitempty"`
	Enforce              *bool    `yaml:"enforce" json:"enforce"`
	Mode                 string   `yaml:"mode" json:"mode,omitempty"`
	Allow                []string `yaml:"allow" json:"allow,omitempty"`
	AllowOut             []string `yaml:"allowOut" json:"allowOut,omitempty"`
	AllowPrivateNetworks *bool    `yaml:"allow-private-networks" json:"allow-private-networks,omitempty"`
	AllowPrivateAlias    *bool    `yaml:"allowPrivateNetworks" json:"allowPrivateNetworks,omitempty"`
	Report               bool     `yaml:"report" json:"report,omitempty"`
	Quotas               Quotas   `yaml:"quotas" json:"quotas,omitempty"`
	Deny                 []string `yaml:"deny" json:"deny,omitempty"`
	DoHEndpoints         []string `yaml:"doh-endpoints" json:"doh-endpoints,omitempty"`
}

// Reasons for the deny-all policies that Parse and Load return.
const (
	ReasonFileAbsent   = "policy file absent"
	ReasonFileEmpty    = "policy file empty"
	ReasonFileInvalid  = "policy file invalid"
	ReasonFileUnread   = "policy file unreadable"
	ReasonNotEnforced  = "policy enforce is false"
	ReasonEnforceUnset = "policy enforce is not set"
)

// MaxDocumentSize bounds the policy file; a larger one denies everything.
const MaxDocumentSize = 4 << 20

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
	mode := Allowlist
	if d.Mode != "" {
		m, err := ParseMode(d.Mode)
		if err != nil {
			return nil, err
		}
		mode = m
	}
	if d.Allow != nil && d.AllowOut != nil {
		return nil, errors.New(`policy: both "allow" and "allowOut" are set; use one`)
	}
	if d.AllowPrivateNetworks != nil && d.AllowPrivateAlias != nil {
		return nil, errors.New(`policy: both "allow-private-networks" and "allowPrivateNetworks" are set; use one`)
	}
	allowPrivate := d.AllowPrivateNetworks
	if allowPrivate == nil {
		allowPrivate = d.AllowPrivateAlias
	}
	return New(Config{
		Mode:                 mode,
		Allow:                append(d.Allow, d.AllowOut...),
		AllowPrivateNetworks: allowPrivate != nil && *allowPrivate,
		Report:               d.Report,
		Quotas:               d.Quotas,
		Deny:                 d.Deny,
		DoHEndpoints:         d.DoHEndpoints,
	})
}

// Parse compiles a policy document. It never returns nil: if the document
// is empty, unparseable or invalid, the policy denies everything, says why,
// and the error gives the detail.
func Parse(data []byte) (*Policy, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return Deny(ReasonFileEmpty), errors.New("policy: document is empty")
	}
	if len(data) > MaxDocumentSize {
		return Deny(ReasonFileInvalid), fmt.Errorf("policy: document is larger than %d bytes", MaxDocumentSize)
	}
	var doc Document
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Deny(ReasonFileEmpty), errors.New("policy: document is empty")
		}
		return Deny(ReasonFileInvalid), fmt.Errorf("policy: parse: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Deny(ReasonFileInvalid), errors.New("policy: more than one document in the file")
	}
	p, err := doc.Compile()
	if err != nil {
		return Deny(ReasonFileInvalid), err
	}
	return p, nil
}

// Load reads and compiles the policy file at path. Like Parse it never
// returns nil, and every failure denies everything.
func Load(path string) (*Policy, error) {
	p, _, err := load(path)
	return p, err
}

// load is Load that also returns the bytes it read.
func load(path string) (*Policy, []byte, error) {
	data, err := readLimited(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Deny(ReasonFileAbsent), nil, fmt.Errorf("policy: %w", err)
	case err != nil:
		return Deny(ReasonFileUnread), nil, fmt.Errorf("policy: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		err = fmt.Errorf("%w (in %s)", err, path)
	}
	return p, data, err
}

// readLimited reads a file, or up to one byte more than MaxDocumentSize of
// it, which Parse then refuses.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxDocumentSize+1))
}
