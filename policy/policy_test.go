package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestNormalizeName(t *testing.T) {
	tests := []struct {
		in, want string // want "" means invalid
	}{
		{"github.com", "github.com"},
		{"GitHub.COM", "github.com"},
		{"github.com.", "github.com"},
		{"API.GitHub.com.", "api.github.com"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"BÜCHER.example", "xn--bcher-kva.example"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"XN--BCHER-KVA.example", "xn--bcher-kva.example"},
		{"_dmarc.example.com", "_dmarc.example.com"},
		{"a-b.example", "a-b.example"},
		{"localhost", "localhost"},
		{strings.Repeat("a", 63) + ".com", strings.Repeat("a", 63) + ".com"},

		{"", ""},
		{".", ""},
		{"github..com", ""},
		{".github.com", ""},
		{"github.com..", ""},
		{"-github.com", ""},
		{"github-.com", ""},
		{"git hub.com", ""},
		{"github.com/", ""},
		{"github.com:443", ""},
		{"xn--zz.example", ""}, // an A-label that does not decode
		{strings.Repeat("a", 64) + ".com", ""},
		{strings.Repeat("a.", 127) + "com", ""},
		{"127.0.0.1", ""},
		{"2130706433", ""},
		{"foo.123", ""},
		{"example.0x7f", ""},
		{"*.example.com", ""},
		{"exa\x00mple.com", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := NormalizeName(tt.in)
			if tt.want == "" {
				if err == nil {
					t.Errorf("NormalizeName(%q) = %q, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("NormalizeName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestEntryErrors(t *testing.T) {
	tests := []struct {
		entry, why string
	}{
		{"", "empty entry"},
		{"   ", "empty entry"},
		{"github.com:0", "not in 1-65535"},
		{"github.com:65536", "not in 1-65535"},
		{"github.com:-1", "not in 1-65535"},
		{"github.com:+22", "not in 1-65535"},
		{"github.com:http", "not in 1-65535"},
		{"github.com:", "missing port"},
		{"[2001:db8::1]:", "unexpected"},
		{"github.com:90-80", "empty port range"},
		{"*.", "invalid wildcard"},
		{"*.com", "public suffix"},
		{"*.co.uk", "public suffix"},
		{"*.*.example.com", "invalid wildcard"},
		{"foo*.example.com", `"*" may only be`},
		{"a.*.example.com", `"*" may only be`},
		{"**", `"*" may only be`},
		{"203.0.113.5/24", "did you mean 203.0.113.0/24"},
		{"203.0.113.0/33", "invalid address prefix"},
		{"[2001:db8::/32", `missing "]"`},
		{"[203.0.113.1]:443", "brackets are only for IPv6"},
		{"[2001:db8::1]x", "unexpected"},
		{"1.2.3.256", "not a valid one"},
		{"bad_host!.com", "invalid name"},
	}
	for _, tt := range tests {
		t.Run(tt.entry, func(t *testing.T) {
			_, err := New(Config{Mode: Allowlist, Allow: []string{"github.com", tt.entry}})
			var ee *EntryError
			if !errors.As(err, &ee) {
				t.Fatalf("New with %q: %v, want an EntryError", tt.entry, err)
			}
			if ee.Entry != tt.entry || !strings.Contains(err.Error(), tt.why) {
				t.Errorf("New with %q: %v, want it to name the entry and say %q", tt.entry, err, tt.why)
			}
		})
	}
	// Every bad entry is reported, not only the first.
	_, err := New(Config{Mode: Allowlist, Allow: []string{"*.com", "ok.example", "x:0"}})
	if err == nil || !strings.Contains(err.Error(), `"*.com"`) || !strings.Contains(err.Error(), `"x:0"`) {
		t.Errorf("two bad entries: %v", err)
	}
	if _, err := New(Config{Mode: Mode(9)}); err == nil {
		t.Error("New accepted an unknown mode")
	}
}

func mustNew(t testing.TB, cfg Config) *Policy {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecide(t *testing.T) {
	p := mustNew(t, Config{Mode: Allowlist, Allow: []string{
		"github.com",
		"github.com:22",
		"*.npmjs.org",
		"registry.example.com:*",
		"ports.example:8000-8100",
		"203.0.113.0/24:443",
		"203.0.113.128/25:8443",
		"[2001:db8::/32]:443",
		"198.51.100.7",
		"2001:db8:ffff::1",
		"bücher.example",
		"*.github.io",
	}})
	tests := []struct {
		host   string
		port   uint16
		allow  bool
		rule   string
		reason string
	}{
		{"github.com", 443, true, "github.com", ReasonAllowedByRule},
		{"github.com", 80, true, "github.com", ReasonAllowedByRule},
		{"GitHub.com.", 443, true, "github.com", ReasonAllowedByRule},
		{"github.com", 22, true, "github.com:22", ReasonAllowedByRule},
		{"github.com", 8080, false, "github.com", ReasonPortNotListed},
		{"api.github.com", 443, false, "", ReasonNoRule},
		{"evilgithub.com", 443, false, "", ReasonNoRule},
		{"github.com.evil.com", 443, false, "", ReasonNoRule},
		{"registry.npmjs.org", 443, true, "*.npmjs.org", ReasonAllowedByRule},
		{"a.b.c.npmjs.org", 443, true, "*.npmjs.org", ReasonAllowedByRule},
		{"npmjs.org", 443, false, "", ReasonNoRule},
		{"xnpmjs.org", 443, false, "", ReasonNoRule},
		{"npmjs.org.evil.com", 443, false, "", ReasonNoRule},
		{"registry.npmjs.org", 22, false, "*.npmjs.org", ReasonPortNotListed},
		{"registry.example.com", 5000, true, "registry.example.com:*", ReasonAllowedByRule},
		{"registry.example.com", 1, true, "registry.example.com:*", ReasonAllowedByRule},
		{"ports.example", 7999, false, "ports.example:8000-8100", ReasonPortNotListed},
		{"ports.example", 8000, true, "ports.example:8000-8100", ReasonAllowedByRule},
		{"ports.example", 8100, true, "ports.example:8000-8100", ReasonAllowedByRule},
		{"ports.example", 8101, false, "ports.example:8000-8100", ReasonPortNotListed},
		{"203.0.113.9", 443, true, "203.0.113.0/24:443", ReasonAllowedByRule},
		{"203.0.113.9", 80, false, "203.0.113.0/24:443", ReasonPortNotListed},
		{"203.0.113.200", 8443, true, "203.0.113.128/25:8443", ReasonAllowedByRule},
		{"203.0.113.200", 443, true, "203.0.113.0/24:443", ReasonAllowedByRule},
		{"203.0.114.1", 443, false, "", ReasonNoRule},
		{"[::ffff:203.0.113.9]", 443, true, "203.0.113.0/24:443", ReasonAllowedByRule},
		{"3405803785", 443, true, "203.0.113.0/24:443", ReasonAllowedByRule}, // 203.0.113.9
		{"2001:db8::1", 443, true, "[2001:db8::/32]:443", ReasonAllowedByRule},
		{"[2001:db8::1]", 443, true, "[2001:db8::/32]:443", ReasonAllowedByRule},
		{"2001:db9::1", 443, false, "", ReasonNoRule},
		{"198.51.100.7", 80, true, "198.51.100.7", ReasonAllowedByRule},
		{"198.51.100.8", 80, false, "", ReasonNoRule},
		{"2001:db8:ffff::1", 80, true, "2001:db8:ffff::1", ReasonAllowedByRule},
		{"xn--bcher-kva.example", 443, true, "bücher.example", ReasonAllowedByRule},
		{"BÜCHER.example", 443, true, "bücher.example", ReasonAllowedByRule},
		{"user.github.io", 443, true, "*.github.io", ReasonAllowedByRule},
		{"1.2.3.256", 443, false, "", ReasonInvalidHost},
		{"foo.123", 443, false, "", ReasonInvalidHost},
		{"git hub.com", 443, false, "", ReasonInvalidHost},
		{"", 443, false, "", ReasonInvalidHost},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s:%d", tt.host, tt.port), func(t *testing.T) {
			d := p.Decide(tt.host, tt.port)
			if d.Allowed != tt.allow || d.Rule != tt.rule || d.Reason != tt.reason || d.Report {
				t.Errorf("Decide(%q, %d) = %+v, want allowed=%v rule=%q reason=%q", tt.host, tt.port, d, tt.allow, tt.rule, tt.reason)
			}
		})
	}
}

func TestDecideModes(t *testing.T) {
	star := mustNew(t, Config{Mode: Allowlist, Allow: []string{"*"}})
	star443 := mustNew(t, Config{Mode: Allowlist, Allow: []string{"*:443"}})
	open := mustNew(t, Config{Mode: Open})
	deny := mustNew(t, Config{Mode: DenyAll, Allow: []string{"github.com"}})
	empty := mustNew(t, Config{Mode: Allowlist})
	report := mustNew(t, Config{Mode: Allowlist, Allow: []string{"github.com"}, Report: true})
	var nilPolicy *Policy
	tests := []struct {
		name   string
		p      *Policy
		host   string
		port   uint16
		allow  bool
		report bool
		reason string
	}{
		{"star any name", star, "anything.example", 5432, true, false, ReasonAllowedByRule},
		{"star any address", star, "8.8.8.8", 53, true, false, ReasonAllowedByRule},
		{"star port", star443, "anything.example", 443, true, false, ReasonAllowedByRule},
		{"star wrong port", star443, "anything.example", 80, false, false, ReasonPortNotListed},
		{"open", open, "anything.example", 22, true, false, ReasonOpen},
		{"open address", open, "1.1.1.1", 22, true, false, ReasonOpen},
		{"open invalid host", open, "a..b", 443, false, false, ReasonInvalidHost},
		{"deny all ignores entries", deny, "github.com", 443, false, false, ReasonDenyAll},
		{"empty allowlist", empty, "github.com", 443, false, false, ReasonNoRule},
		{"nil policy", nilPolicy, "github.com", 443, false, false, ReasonNoPolicy},
		{"zero policy", &Policy{}, "github.com", 443, false, false, ""},
		{"report allows and marks", report, "evil.example", 443, true, true, ReasonNoRule},
		{"report allowed is not marked", report, "github.com", 443, true, false, ReasonAllowedByRule},
		{"report never allows an invalid host", report, "1.2.3.999", 443, false, false, ReasonInvalidHost},
		{"deny with reason", Deny("policy file absent"), "github.com", 443, false, false, "policy file absent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.p.Decide(tt.host, tt.port)
			if d.Allowed != tt.allow || d.Report != tt.report || (tt.reason != "" && d.Reason != tt.reason) {
				t.Errorf("Decide(%q, %d) = %+v, want allowed=%v report=%v reason=%q", tt.host, tt.port, d, tt.allow, tt.report, tt.reason)
			}
		})
	}
	if (Decision{}).Allowed {
		t.Error("the zero Decision allows")
	}
	if d := open.DecideAddr(netip.Addr{}, 443); d.Allowed {
		t.Errorf("open policy allowed the invalid address: %+v", d)
	}
	if nilPolicy.AllowPrivateNetworks() || nilPolicy.Mode() != DenyAll || nilPolicy.DenyReason() == "" {
		t.Error("a nil policy is not deny-all")
	}
	if !mustNew(t, Config{Mode: Open, AllowPrivateNetworks: true}).AllowPrivateNetworks() {
		t.Error("AllowPrivateNetworks lost")
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"open": Open, "Allowlist": Allowlist, "deny": DenyAll, "deny-all": DenyAll} {
		if m, err := ParseMode(in); err != nil || m != want {
			t.Errorf("ParseMode(%q) = %v, %v", in, m, err)
		}
	}
	if m, err := ParseMode("allow-all"); err == nil || m != DenyAll {
		t.Errorf("ParseMode(allow-all) = %v, %v; want an error and DenyAll", m, err)
	}
}

func FuzzEntry(f *testing.F) {
	for _, s := range []string{"github.com", "*.npmjs.org", "github.com:22", "registry.example.com:*", "203.0.113.0/24:443", "[2001:db8::/32]:443", "*", "*:443", "a:1-2", "[::1]", "xn--bcher-kva.example", "2130706433:80"} {
		f.Add(s, uint16(443))
	}
	f.Fuzz(func(t *testing.T, s string, port uint16) {
		e, err := compileEntry(s)
		if err != nil {
			var ee *EntryError
			if !errors.As(err, &ee) || ee.Reason == "" {
				t.Fatalf("compileEntry(%q): %v is not an EntryError with a reason", s, err)
			}
			return
		}
		if len(e.rule.ports) == 0 || e.rule.text == "" {
			t.Fatalf("compileEntry(%q) = %+v: no ports or text", s, e)
		}
		p, err := New(Config{Mode: Allowlist, Allow: []string{s}})
		if err != nil {
			t.Fatalf("New with accepted entry %q: %v", s, err)
		}
		switch e.kind {
		case kindName:
			if d := p.Decide(e.name, port); d.Allowed != e.rule.allowsPort(port) {
				t.Fatalf("entry %q, Decide(%q, %d) = %+v", s, e.name, port, d)
			}
			if d := p.Decide("sub."+e.name, port); d.Allowed && len(e.name) < 250 {
				t.Fatalf("exact entry %q allowed a subdomain: %+v", s, d)
			}
		case kindWildcard:
			if d := p.Decide(e.name, port); d.Allowed {
				t.Fatalf("wildcard %q allowed its apex: %+v", s, d)
			}
		case kindPrefix:
			if d := p.DecideAddr(e.prefix.Addr(), port); d.Allowed != e.rule.allowsPort(port) {
				t.Fatalf("entry %q, DecideAddr(%v, %d) = %+v", s, e.prefix.Addr(), port, d)
			}
		}
	})
}

func FuzzNormalizeName(f *testing.F) {
	for _, s := range []string{"github.com", "GitHub.COM.", "bücher.example", "xn--bcher-kva.example", "_srv.example", "a..b", "2130706433"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := NormalizeName(s)
		if err != nil {
			return
		}
		// Canonical names are fixed points, and valid.
		if n2, err := NormalizeName(n); err != nil || n2 != n {
			t.Fatalf("NormalizeName(%q) = %q, but NormalizeName(%q) = %q, %v", s, n, n, n2, err)
		}
		if len(n) > 253 || strings.ToLower(n) != n || strings.HasSuffix(n, ".") {
			t.Fatalf("NormalizeName(%q) = %q is not canonical", s, n)
		}
	})
}

func TestDecideName(t *testing.T) {
	p := mustNew(t, Config{Mode: Allowlist, Allow: []string{"github.com:22", "*.npmjs.org:8443", "203.0.113.0/24"}})
	tests := []struct {
		host  string
		allow bool
		rule  string
	}{
		{"github.com", true, "github.com:22"},
		{"GITHUB.com.", true, "github.com:22"},
		{"api.github.com", false, ""},
		{"registry.npmjs.org", true, "*.npmjs.org:8443"},
		{"npmjs.org", false, ""},
		{"203.0.113.9", false, ""}, // an address is not a name to resolve
		{"exfil-0123456789abcdef.evil.example", false, ""},
	}
	for _, tt := range tests {
		d := p.DecideName(tt.host)
		if d.Allowed != tt.allow || d.Rule != tt.rule {
			t.Errorf("DecideName(%q) = %+v, want allowed=%v rule=%q", tt.host, d, tt.allow, tt.rule)
		}
	}
	if d := Deny("policy file absent").DecideName("github.com"); d.Allowed || d.Reason != "policy file absent" {
		t.Errorf("deny-all DecideName = %+v", d)
	}
	if d := mustNew(t, Config{Mode: Open}).DecideName("anything.example"); !d.Allowed {
		t.Errorf("open DecideName = %+v", d)
	}
}
