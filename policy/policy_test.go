package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
				assert.Error(t, err, "NormalizeName(%q) = %q, want an error", tt.in, got)
				return
			}
			assert.NoError(t, err, "NormalizeName(%q)", tt.in)
			assert.Equal(t, tt.want, got, "NormalizeName(%q)", tt.in)
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
			require.ErrorAs(t, err, &ee, "New with %q: want an EntryError", tt.entry)
			assert.Equal(t, tt.entry, ee.Entry, "New with %q: %v, want it to name the entry", tt.entry, err)
			assert.Contains(t, err.Error(), tt.why, "New with %q", tt.entry)
		})
	}
	// Every bad entry is reported, not only the first.
	_, err := New(Config{Mode: Allowlist, Allow: []string{"*.com", "ok.example", "x:0"}})
	assert.ErrorContains(t, err, `"*.com"`, "two bad entries")
	assert.ErrorContains(t, err, `"x:0"`, "two bad entries")
	_, err = New(Config{Mode: Mode(9)})
	assert.Error(t, err, "New accepted an unknown mode")
}

func mustNew(t testing.TB, cfg Config) *Policy {
	t.Helper()
	p, err := New(cfg)
	require.NoError(t, err)
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
			msg := fmt.Sprintf("Decide(%q, %d) = %+v", tt.host, tt.port, d)
			assert.Equal(t, tt.allow, d.Allowed, msg)
			assert.Equal(t, tt.rule, d.Rule, msg)
			assert.Equal(t, tt.reason, d.Reason, msg)
			assert.False(t, d.Report, msg)
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
		{"star any address", star, "93.184.216.34", 53, true, false, ReasonAllowedByRule},
		{"star port", star443, "anything.example", 443, true, false, ReasonAllowedByRule},
		{"star wrong port", star443, "anything.example", 80, false, false, ReasonPortNotListed},
		{"open", open, "anything.example", 22, true, false, ReasonOpen},
		{"open address", open, "93.184.216.34", 22, true, false, ReasonOpen},
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
			msg := fmt.Sprintf("Decide(%q, %d) = %+v", tt.host, tt.port, d)
			assert.Equal(t, tt.allow, d.Allowed, msg)
			assert.Equal(t, tt.report, d.Report, msg)
			if tt.reason != "" {
				assert.Equal(t, tt.reason, d.Reason, msg)
			}
		})
	}
	assert.False(t, (Decision{}).Allowed, "the zero Decision allows")
	d := open.DecideAddr(netip.Addr{}, 443)
	assert.False(t, d.Allowed, "open policy allowed the invalid address: %+v", d)
	assert.False(t, nilPolicy.AllowPrivateNetworks(), "a nil policy is not deny-all: it allows private networks")
	assert.Equal(t, DenyAll, nilPolicy.Mode(), "a nil policy is not deny-all")
	assert.NotEmpty(t, nilPolicy.DenyReason(), "a nil policy is not deny-all: it gives no deny reason")
	assert.True(t, mustNew(t, Config{Mode: Open, AllowPrivateNetworks: true}).AllowPrivateNetworks(), "AllowPrivateNetworks lost")
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"open": Open, "Allowlist": Allowlist, "deny": DenyAll, "deny-all": DenyAll} {
		m, err := ParseMode(in)
		assert.NoError(t, err, "ParseMode(%q)", in)
		assert.Equal(t, want, m, "ParseMode(%q)", in)
	}
	m, err := ParseMode("allow-all")
	assert.Error(t, err, "ParseMode(allow-all): want an error and DenyAll")
	assert.Equal(t, DenyAll, m, "ParseMode(allow-all): want an error and DenyAll")
}

func FuzzEntry(f *testing.F) {
	for _, s := range []string{"github.com", "*.npmjs.org", "github.com:22", "registry.example.com:*", "203.0.113.0/24:443", "[2001:db8::/32]:443", "*", "*:443", "a:1-2", "[::1]", "xn--bcher-kva.example", "2130706433:80"} {
		f.Add(s, uint16(443))
	}
	f.Fuzz(func(t *testing.T, s string, port uint16) {
		e, err := compileEntry(s)
		if err != nil {
			var ee *EntryError
			require.ErrorAs(t, err, &ee, "compileEntry(%q): %v is not an EntryError with a reason", s, err)
			require.NotEmpty(t, ee.Reason, "compileEntry(%q): %v is not an EntryError with a reason", s, err)
			return
		}
		require.NotEmpty(t, e.rule.ports, "compileEntry(%q) = %+v: no ports or text", s, e)
		require.NotEmpty(t, e.rule.text, "compileEntry(%q) = %+v: no ports or text", s, e)
		p, err := New(Config{Mode: Allowlist, Allow: []string{s}})
		require.NoError(t, err, "New with accepted entry %q", s)
		switch e.kind {
		case kindName:
			d := p.Decide(e.name, port)
			require.Equal(t, e.rule.allowsPort(port), d.Allowed, "entry %q, Decide(%q, %d) = %+v", s, e.name, port, d)
			d = p.Decide("sub."+e.name, port)
			if len(e.name) < 250 {
				require.False(t, d.Allowed, "exact entry %q allowed a subdomain: %+v", s, d)
			}
		case kindWildcard:
			d := p.Decide(e.name, port)
			require.False(t, d.Allowed, "wildcard %q allowed its apex: %+v", s, d)
		case kindPrefix:
			d := p.DecideAddr(e.prefix.Addr(), port)
			require.Equal(t, e.rule.allowsPort(port), d.Allowed, "entry %q, DecideAddr(%v, %d) = %+v", s, e.prefix.Addr(), port, d)
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
		n2, err := NormalizeName(n)
		require.NoError(t, err, "NormalizeName(%q) = %q, but NormalizeName(%q) fails", s, n, n)
		require.Equal(t, n, n2, "NormalizeName(%q) = %q, but NormalizeName(%q) differs", s, n, n)
		require.LessOrEqual(t, len(n), 253, "NormalizeName(%q) = %q is not canonical: too long", s, n)
		require.Equal(t, strings.ToLower(n), n, "NormalizeName(%q) = %q is not canonical: not lower case", s, n)
		require.False(t, strings.HasSuffix(n, "."), "NormalizeName(%q) = %q is not canonical: trailing dot", s, n)
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
		assert.Equal(t, tt.allow, d.Allowed, "DecideName(%q) = %+v", tt.host, d)
		assert.Equal(t, tt.rule, d.Rule, "DecideName(%q) = %+v", tt.host, d)
	}
	d := Deny("policy file absent").DecideName("github.com")
	assert.False(t, d.Allowed, "deny-all DecideName = %+v", d)
	assert.Equal(t, "policy file absent", d.Reason, "deny-all DecideName = %+v", d)
	d = mustNew(t, Config{Mode: Open}).DecideName("anything.example")
	assert.True(t, d.Allowed, "open DecideName = %+v", d)
}

// TestDecidePort says which ports no destination could be allowed on, for
// refusing a silent client at once.
func TestDecidePort(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		port   uint16
		allow  bool
		reason string
	}{
		{"deny-all", Config{Mode: DenyAll}, 443, false, ReasonDenyAll},
		{"empty allowlist", Config{}, 443, false, ReasonPortNotListed},
		{"default ports", Config{Allow: []string{"github.com"}}, 443, true, ReasonAllowedByRule},
		{"default ports, other", Config{Allow: []string{"github.com"}}, 22, false, ReasonPortNotListed},
		{"a named port", Config{Allow: []string{"github.com:22"}}, 22, true, ReasonAllowedByRule},
		{"a range, inside", Config{Allow: []string{"a.test:8000-8100"}}, 8100, true, ReasonAllowedByRule},
		{"a range, just outside", Config{Allow: []string{"a.test:8000-8100"}}, 8101, false, ReasonPortNotListed},
		{"an address entry", Config{Allow: []string{"203.0.113.0/24:5432"}}, 5432, true, ReasonAllowedByRule},
		{"a deny entry admits nothing", Config{Allow: []string{"!a.test:22"}}, 22, false, ReasonPortNotListed},
		{"open", Config{Mode: Open}, 6379, true, ReasonOpen},
		{"open, DNS over TLS", Config{Mode: Open}, 853, false, ReasonDoT},
		{"any port, DNS over TLS", Config{Allow: []string{"a.test:*"}}, 853, false, ReasonDoT},
		{"853 named", Config{Allow: []string{"dns.test:853"}}, 853, true, ReasonAllowedByRule},
		{"report mode", Config{Report: true}, 22, true, ReasonPortNotListed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg)
			require.NoError(t, err)
			d := p.DecidePort(tt.port)
			assert.Equal(t, tt.allow, d.Allowed, "allowed")
			assert.Equal(t, tt.reason, d.Reason, "reason")
		})
	}
	var none *Policy
	assert.False(t, none.DecidePort(443).Allowed, "a nil policy")
}
