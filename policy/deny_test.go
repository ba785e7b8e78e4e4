package policy

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/netguard"
)

// TestDenyEntries: a deny entry, in every form, wins over allow entries,
// wildcards, "*" and open mode, and its reason names it.
func TestDenyEntries(t *testing.T) {
	must := func(cfg Config) *Policy {
		p, err := New(cfg)
		require.NoError(t, err)
		return p
	}
	open := must(Config{Mode: Open, Deny: []string{"pastebin.com", "*.ngrok.io", "203.0.113.0/24", "ssh.example.com:22"}})
	wild := must(Config{Allow: []string{"*.example.com", "*", "!secret.example.com", "!198.51.100.7"}})
	for _, tc := range []struct {
		name    string
		p       *Policy
		host    string
		port    uint16
		allowed bool
		rule    string
	}{
		{"open, denied name, any port", open, "pastebin.com", 8443, false, "!pastebin.com"},
		{"open, denied name, normalised", open, "PasteBin.com.", 443, false, "!pastebin.com"},
		{"open, denied wildcard", open, "x.ngrok.io", 443, false, "!*.ngrok.io"},
		{"open, a denied wildcard covers the apex too", open, "ngrok.io", 443, false, "!*.ngrok.io"},
		{"open, denied prefix", open, "203.0.113.9", 443, false, "!203.0.113.0/24"},
		{"open, denied prefix, mapped", open, "::ffff:203.0.113.9", 443, false, "!203.0.113.0/24"},
		{"open, deny with a port: that port", open, "ssh.example.com", 22, false, "!ssh.example.com:22"},
		{"open, deny with a port: others go", open, "ssh.example.com", 443, true, ""},
		{"open, the rest", open, "github.com", 443, true, ""},
		{"wildcard and star, denied name", wild, "secret.example.com", 443, false, "!secret.example.com"},
		{"wildcard and star, sibling", wild, "www.example.com", 443, true, "*.example.com"},
		{"star, denied address", wild, "198.51.100.7", 443, false, "!198.51.100.7"},
		{"star, other address", wild, "198.51.100.8", 443, true, "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.p.Decide(tc.host, tc.port)
			assert.Equal(t, tc.allowed, d.Allowed, "%+v", d)
			if !tc.allowed {
				assert.Equal(t, ReasonDenyEntry, d.Reason)
				assert.Equal(t, tc.rule, d.Rule)
			} else if tc.rule != "" {
				assert.Equal(t, tc.rule, d.Rule)
			}
		})
	}
	// DNS: a denied name does not resolve either.
	assert.False(t, open.DecideName("pastebin.com").Allowed)
	assert.False(t, open.DecideName("a.ngrok.io").Allowed)
	assert.True(t, open.DecideName("ssh.example.com").Allowed, "a deny entry for one port kept the name from resolving")
	assert.False(t, open.Decide("ssh.example.com", 22).Allowed, "the deny entry's own port")
	// Report mode marks a deny entry's denial like any other.
	rep := must(Config{Mode: Open, Deny: []string{"pastebin.com"}, Report: true})
	d := rep.Decide("pastebin.com", 443)
	assert.True(t, d.Allowed && d.Report, "%+v", d)
	assert.Equal(t, ReasonDenyEntry, d.Reason)
}

func TestDenyEntryErrors(t *testing.T) {
	for _, bad := range []string{"*", "https://pastebin.com", "*.com", ""} {
		_, err := New(Config{Mode: Open, Deny: []string{bad}})
		assert.Error(t, err, "deny %q", bad)
		_, err = New(Config{Mode: Open, Allow: []string{"!" + bad}})
		assert.Error(t, err, "allow !%q", bad)
	}
	enforce := true
	p, err := (&Document{Enforce: &enforce, Mode: "open", Deny: []string{"pastebin.com"}, Allow: []string{"!*.ngrok.io"}}).Compile()
	require.NoError(t, err)
	assert.False(t, p.Decide("pastebin.com", 443).Allowed)
	assert.False(t, p.Decide("a.ngrok.io", 443).Allowed)
	assert.True(t, p.Decide("github.com", 443).Allowed)
}

// TestDNSSideDoors: DNS over TLS needs an entry naming port 853, and the
// public DoH resolvers an entry naming them exactly, whatever "*", open
// mode or a wildcard say.
func TestDNSSideDoors(t *testing.T) {
	must := func(cfg Config) *Policy {
		p, err := New(cfg)
		require.NoError(t, err)
		return p
	}
	open := must(Config{Mode: Open})
	star := must(Config{Allow: []string{"*", "*.dns.google:*", "dot.example.net:*"}})
	named := must(Config{Allow: []string{"dns.google", "dot.example.net:853", "8.8.8.8:443", "1.1.1.0/24"}})
	extra := must(Config{Mode: Open, DoHEndpoints: []string{"doh.internal.example", "192.0.2.53"}})
	for _, tc := range []struct {
		name    string
		p       *Policy
		host    string
		port    uint16
		allowed bool
		reason  string
	}{
		{"open, DoT by name", open, "dot.example.net", 853, false, ReasonDoT},
		{"open, DoT by address", open, "93.184.216.34", 853, false, ReasonDoT},
		{"star, DoT", star, "dot.example.net", 853, false, ReasonDoT},
		{"star, other port", star, "dot.example.net", 443, true, ReasonAllowedByRule},
		{"named 853", named, "dot.example.net", 853, true, ReasonAllowedByRule},
		{"open, DoH name", open, "dns.google", 443, false, ReasonDoH},
		{"open, DoH name, any case", open, "Cloudflare-DNS.com.", 443, false, ReasonDoH},
		{"open, DoH address", open, "8.8.8.8", 443, false, ReasonDoH},
		{"open, a DoH resolver's subdomain", open, "dns64.dns.google", 443, false, ReasonDoH},
		{"open, DoH address IPv6", open, "2606:4700:4700::1111", 443, false, ReasonDoH},
		{"star and a wildcard, DoH name", star, "dns.google", 443, false, ReasonDoH},
		{"named exactly", named, "dns.google", 443, true, ReasonAllowedByRule},
		{"address named exactly", named, "8.8.8.8", 443, true, ReasonAllowedByRule},
		{"address within a named prefix only", named, "1.1.1.1", 443, false, ReasonDoH},
		{"extra name", extra, "doh.internal.example", 443, false, ReasonDoH},
		{"extra address", extra, "192.0.2.53", 443, false, ReasonDoH},
		{"not a resolver", open, "www.google.com", 443, true, ReasonOpen},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.p.Decide(tc.host, tc.port)
			assert.Equal(t, tc.allowed, d.Allowed, "%+v", d)
			assert.Equal(t, tc.reason, d.Reason)
		})
	}
	assert.False(t, open.DecideName("dns.google").Allowed, "a DoH resolver's name does not resolve")
	assert.True(t, named.DecideName("dns.google").Allowed)
	_, err := New(Config{Mode: Open, DoHEndpoints: []string{"not a name!"}})
	assert.Error(t, err)
	assert.Contains(t, KnownDoHEndpoints(), "dns.google")
}

func TestDecideDoH(t *testing.T) {
	p, err := New(Config{Mode: Open, Allow: []string{"doh.example.net", "*.example.org"}})
	require.NoError(t, err)
	assert.True(t, p.DecideDoH("DoH.example.net.", 443).Allowed, "named exactly")
	assert.False(t, p.DecideDoH("doh.example.net", 8443).Allowed, "named, another port")
	for _, host := range []string{"x.example.org", "github.com", "bad host"} {
		d := p.DecideDoH(host, 443)
		assert.False(t, d.Allowed, host)
	}
	assert.Equal(t, ReasonDoH, p.DecideDoH("x.example.org", 443).Reason)
}

// TestDialCheck: a dial checks the address against the policy the
// request carries, and a request that carries none is refused.
func TestDialCheck(t *testing.T) {
	p, err := New(Config{Allow: []string{"api.example.com"}, Deny: []string{"203.0.113.0/24"}})
	require.NoError(t, err)
	ctx := WithPolicy(context.Background(), p)
	inside, outside := netip.MustParseAddrPort("203.0.113.7:443"), netip.MustParseAddrPort("198.51.100.7:443")
	assert.NoError(t, DialCheck(ctx, "api.example.com", outside))
	assert.ErrorIs(t, DialCheck(ctx, "api.example.com", inside), netguard.ErrDenied)
	for name, ctx := range map[string]context.Context{
		"no policy":  context.Background(),
		"nil policy": WithPolicy(context.Background(), nil),
	} {
		err := DialCheck(ctx, "api.example.com", outside)
		assert.ErrorIs(t, err, netguard.ErrDenied, name)
		var re *ResolvedError
		if assert.ErrorAs(t, err, &re, name) {
			assert.Equal(t, ReasonNoPolicy, re.Reason, name)
		}
	}
}

// TestCheckResolved: at dial time, the address a name resolved to is
// refused when a deny entry covers it (in any spelling that reaches it)
// or when it is a DNS-over-HTTPS resolver's and the name is not allowed
// exactly.
func TestCheckResolved(t *testing.T) {
	must := func(cfg Config) *Policy {
		p, err := New(cfg)
		require.NoError(t, err)
		return p
	}
	open := must(Config{Mode: Open, Allow: []string{"!203.0.113.0/24", "!198.51.100.9:22", "exact.example"}})
	for _, tc := range []struct {
		name, host, addr string
		reason           string // "" for allowed
	}{
		{"deny prefix", "evil.example", "203.0.113.7:443", ReasonDenyEntry},
		{"deny prefix, NAT64 spelling", "evil.example", "[64:ff9b::cb00:7107]:443", ReasonDenyEntry},
		{"deny prefix, 6to4 spelling", "evil.example", "[2002:cb00:7107::1]:443", ReasonDenyEntry},
		{"deny prefix, mapped", "evil.example", "[::ffff:203.0.113.7]:443", ReasonDenyEntry},
		{"deny entry on another port", "ssh.example", "198.51.100.9:443", ""},
		{"deny entry on its port", "ssh.example", "198.51.100.9:22", ReasonDenyEntry},
		{"a DoH resolver's address", "attacker.example", "1.1.1.1:443", ReasonDoH},
		{"a DoH resolver's address, NAT64", "attacker.example", "[64:ff9b::808:808]:443", ReasonDoH},
		{"a DoH resolver's address, name named exactly", "exact.example", "8.8.8.8:443", ""},
		{"an ordinary address", "www.example", "93.184.215.14:443", ""},
		{"a literal host, judged already", "203.0.113.7", "203.0.113.7:443", ""},
	} {
		err := open.CheckResolved(tc.host, netip.MustParseAddrPort(tc.addr))
		if tc.reason == "" {
			assert.NoError(t, err, tc.name)
			continue
		}
		var re *ResolvedError
		if assert.ErrorAs(t, err, &re, tc.name) {
			assert.Equal(t, tc.reason, re.Reason, tc.name)
		}
	}
	report := must(Config{Mode: Open, Report: true, Allow: []string{"!203.0.113.0/24"}})
	assert.NoError(t, report.CheckResolved("evil.example", netip.MustParseAddrPort("203.0.113.7:443")), "report mode refused")
	var nilPolicy *Policy
	assert.Error(t, nilPolicy.CheckResolved("x.example", netip.MustParseAddrPort("93.184.215.14:443")), "a nil policy allowed")

	// The literal spellings of the same addresses, judged as addresses.
	assert.Equal(t, ReasonDenyEntry, open.Decide("64:ff9b::cb00:7107", 443).Reason)
	assert.Equal(t, ReasonDoH, open.Decide("2002:808:808::1", 443).Reason)
}
