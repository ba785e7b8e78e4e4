package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{"enforce false", "enforce: false\nmode: open\n", "", ReasonNotEnforced, false},
		{"enforce unset", "mode: open\n", "", ReasonEnforceUnset, false},
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
		{"both private keys", "enforce: true\nallow-private-networks: true\nallowPrivateNetworks: false\n", "use one", ReasonFileInvalid, false},
		{"two documents", "enforce: true\nmode: open\n---\nenforce: false\n", "more than one", ReasonFileInvalid, false},
		{"too large", "enforce: true\nallowOut: [" + strings.Repeat("a.example, ", MaxDocumentSize/10) + "]\n", "larger than", ReasonFileInvalid, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse([]byte(tt.doc))
			if p == nil {
				t.Fatal("Parse returned a nil policy")
			}
			if tt.wantErr == "" && err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tt.wantErr)
			}
			if got := p.DenyReason(); got != tt.denyReason {
				t.Errorf("DenyReason() = %q, want %q", got, tt.denyReason)
			}
			if d := p.Decide("github.com", 443); d.Allowed != tt.github443 {
				t.Errorf("Decide(github.com, 443) = %+v, want allowed=%v", d, tt.github443)
			}
		})
	}
}

func TestParsePrivateNetworks(t *testing.T) {
	for _, doc := range []string{
		"enforce: true\nallowOut: ['*']\nallow-private-networks: true\n",
		"enforce: true\nallowOut: ['*']\nallowPrivateNetworks: true\n",
	} {
		p, err := Parse([]byte(doc))
		if err != nil || !p.AllowPrivateNetworks() {
			t.Errorf("Parse(%q): private=%v, %v", doc, p.AllowPrivateNetworks(), err)
		}
	}
	p, err := Parse([]byte("enforce: true\nallowOut: ['*']\n"))
	if err != nil || p.AllowPrivateNetworks() {
		t.Errorf("private networks allowed without the switch: %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p, err := Load(filepath.Join(dir, "absent.yaml"))
	if err == nil || p.DenyReason() != ReasonFileAbsent {
		t.Errorf("absent file: %v, %q", err, p.DenyReason())
	}
	p, err = Load(dir) // a directory cannot be read as a file
	if err == nil || p.DenyReason() != ReasonFileUnread {
		t.Errorf("directory: %v, %q", err, p.DenyReason())
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte("enforce: true\nallowOut: [github.com]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err = Load(path)
	if err != nil || !p.Decide("github.com", 443).Allowed {
		t.Errorf("good file: %v", err)
	}
	if err := os.WriteFile(path, []byte("enforce: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err = Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || p.DenyReason() != ReasonFileInvalid {
		t.Errorf("bad file: %v, %q", err, p.DenyReason())
	}
}
