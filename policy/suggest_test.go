package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSuggest(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	obs := []Observation{
		{Host: "api.github.com", Port: 443, Time: at(1), Succeeded: true},
		{Host: "API.GitHub.com.", Port: 443, Time: at(5), Succeeded: true},
		{Host: "github.com", Port: 22, Time: at(2), Succeeded: true},
		{Host: "github.com", Port: 443, Time: at(3), Succeeded: true},
		{Host: "a.npmjs.org", Port: 443, Time: at(1), Succeeded: true},
		{Host: "b.npmjs.org", Port: 443, Time: at(2), Succeeded: true},
		{Host: "c.npmjs.org", Port: 80, Time: at(3), Succeeded: true},
		{Host: "x.co.uk", Port: 443, Time: at(1), Succeeded: true},
		{Host: "y.co.uk", Port: 443, Time: at(1), Succeeded: true},
		{Host: "z.co.uk", Port: 443, Time: at(1), Succeeded: true},
		{Host: "203.0.113.7", Port: 8443, Time: at(4), Succeeded: true},
		{Host: "2001:db8::1", Port: 443, Time: at(4), Succeeded: true},
		{Host: "only-resolved.example", Port: 0, Time: at(4), Succeeded: true},
		{Host: "evil.example.org", Port: 443, Time: at(6), Succeeded: false},
		{Host: "github.com", Port: 9418, Time: at(7), Succeeded: false}, // tried, but github.com worked otherwise
		{Host: "not a host", Port: 443, Time: at(1), Succeeded: true},
		{Host: "ssh.example", Port: 0, Time: at(8), Succeeded: true}, // resolved, then connected to on 22 only
		{Host: "ssh.example", Port: 22, Time: at(8), Succeeded: true},
	}
	s := Suggest(obs, SuggestConfig{})
	assert.Equal(t, []string{
		"2001:db8::1", "203.0.113.7:8443", "a.npmjs.org", "api.github.com", "b.npmjs.org", "c.npmjs.org",
		"github.com", "github.com:22", "only-resolved.example", "ssh.example:22", "x.co.uk", "y.co.uk", "z.co.uk",
	}, s.Document.Allow, "a name connected to on port 22 only gets no bare entry")
	require.Len(t, s.Attempted, 1)
	assert.Equal(t, "evil.example.org", s.Attempted[0].Entry)
	for _, e := range s.Used {
		if e.Entry == "api.github.com" {
			assert.Equal(t, 2, e.Count)
			assert.Equal(t, at(1), e.FirstSeen)
			assert.Equal(t, at(5), e.LastSeen)
		}
	}
	// The suggestion compiles, and allows exactly what was used.
	p, err := s.Document.Compile()
	require.NoError(t, err)
	for _, o := range obs[:13] {
		if o.Port != 0 {
			assert.True(t, p.Decide(o.Host, o.Port).Allowed, "%s:%d", o.Host, o.Port)
		}
	}
	assert.False(t, p.Decide("evil.example.org", 443).Allowed)
	assert.True(t, p.DecideName("ssh.example").Allowed, "a name's port entry lets it resolve")
	assert.True(t, p.DecideName("only-resolved.example").Allowed)
	assert.False(t, p.Decide("d.npmjs.org", 443).Allowed, "not collapsed unless asked")

	// Collapsed: three siblings become a wildcard, never over a public
	// suffix, never "*".
	c := Suggest(obs, SuggestConfig{Collapse: 3})
	assert.Contains(t, c.Document.Allow, "*.npmjs.org")
	assert.NotContains(t, c.Document.Allow, "a.npmjs.org")
	assert.Contains(t, c.Document.Allow, "x.co.uk", "*.co.uk is a public suffix's wildcard")
	assert.NotContains(t, c.Document.Allow, "*")
	pc, err := c.Document.Compile()
	require.NoError(t, err)
	assert.True(t, pc.Decide("d.npmjs.org", 443).Allowed)
}

// TestSuggestNeverLearnsSideDoors: an agent in report mode that reaches
// DNS resolvers around the gateway, or platforms anyone can put a name
// under, does not get them into its learnt allowlist.
func TestSuggestNeverLearnsSideDoors(t *testing.T) {
	now := time.Now()
	var obs []Observation
	for _, h := range []string{"dns.google", "dns64.dns.google", "1.1.1.1", "8.8.8.8", "api.github.com"} {
		obs = append(obs, Observation{Host: h, Port: 443, Time: now, Succeeded: true})
	}
	obs = append(obs, Observation{Host: "9.9.9.9", Port: 853, Time: now, Succeeded: true},
		Observation{Host: "dot.attacker.example", Port: 853, Time: now, Succeeded: true},
		Observation{Host: "both.example", Port: 853, Time: now, Succeeded: true},
		Observation{Host: "both.example", Port: 443, Time: now, Succeeded: true})
	for _, parent := range []string{"workers.dev", "ngrok-free.app", "s3.amazonaws.com", "github.io"} {
		for _, sub := range []string{"a", "b", "c"} {
			obs = append(obs, Observation{Host: sub + "." + parent, Port: 443, Time: now, Succeeded: true})
		}
	}
	s := Suggest(obs, SuggestConfig{Collapse: 3})
	for _, e := range s.Document.Allow {
		assert.NotContains(t, []string{"dns.google", "dns64.dns.google", "1.1.1.1", "8.8.8.8", "9.9.9.9:853", "dot.attacker.example:853", "both.example:853"}, e, "a side door was learnt")
		assert.False(t, strings.HasPrefix(e, "*."), "a platform's suffix was collapsed: %s", e)
	}
	assert.Contains(t, s.Document.Allow, "both.example", "what else a side door's host did is still learnt")
	assert.Contains(t, s.Document.Allow, "a.workers.dev", "the names themselves are learnt")
	var attempted []string
	for _, e := range s.Attempted {
		attempted = append(attempted, e.Entry)
	}
	assert.Subset(t, attempted, []string{"dns.google", "1.1.1.1", "9.9.9.9:853", "both.example:853"}, "side doors are reported as left out")
	p, err := s.Document.Compile()
	require.NoError(t, err)
	assert.False(t, p.Decide("exfil.workers.dev", 443).Allowed)
	assert.False(t, p.Decide("dns.google", 443).Allowed)
}

// TestSuggestRequests: with Requests, hosts whose requests were seen get
// request entries, exact unless IDs are collapsed; their other ports and
// other hosts keep host entries; the suggestion compiles and allows what
// was done and no more.
func TestSuggestRequests(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	req := func(host string, port uint16, method, path string) Observation {
		return Observation{Host: host, Port: port, Time: t0, Succeeded: true, Method: method, Path: path}
	}
	obs := []Observation{
		{Host: "api.github.com", Port: 443, Time: t0, Succeeded: true}, // the intercepted connection
		req("api.github.com", 443, "GET", "/repos/acme/widgets"),
		req("api.github.com", 443, "HEAD", "/repos/acme/widgets"),
		req("api.github.com", 443, "GET", "/repos/acme/widgets/issues/42"),
		req("api.github.com", 443, "POST", "/repos/acme/widgets/issues/17"),
		req("api.github.com", 443, "GET", "/repos/acme/widgets/commits/9f86d081884c7d659a2feaa0c55ad015"),
		req("api.github.com", 443, "GET", "/a*b"),
		{Host: "github.com", Port: 22, Time: t0, Succeeded: true},
		req("files.example", 8080, "GET", "/dist/x.tar.gz"),
		{Host: "files.example", Port: 8080, Time: t0, Succeeded: true},
		{Host: "registry.npmjs.org", Port: 443, Time: t0, Succeeded: true},
		{Host: "evil.example", Port: 443, Time: t0, Succeeded: false, Method: "GET", Path: "/x"},
	}
	s := Suggest(obs, SuggestConfig{Requests: true})
	assert.Equal(t, []string{
		"GET api.github.com/a%2Ab",
		"GET api.github.com/repos/acme/widgets/commits/9f86d081884c7d659a2feaa0c55ad015",
		"GET api.github.com/repos/acme/widgets/issues/42",
		"GET files.example:8080/dist/x.tar.gz",
		"GET,HEAD api.github.com/repos/acme/widgets",
		"POST api.github.com/repos/acme/widgets/issues/17",
		"github.com:22",
		"registry.npmjs.org",
	}, s.Document.Allow)
	p, err := s.Document.Compile()
	require.NoError(t, err)
	assert.True(t, p.DecideRequest("api.github.com", 443, "HEAD", "/repos/acme/widgets").Allowed)
	assert.True(t, p.DecideRequest("api.github.com", 443, "GET", "/a*b").Allowed)
	assert.False(t, p.DecideRequest("api.github.com", 443, "DELETE", "/repos/acme/widgets").Allowed)
	assert.False(t, p.DecideRequest("api.github.com", 443, "GET", "/repos/acme/widgets/issues/43").Allowed, "no ID collapsed unless asked")
	assert.False(t, p.DecideRequest("files.example", 8080, "GET", "/dist/y.tar.gz").Allowed)
	assert.True(t, p.Decide("github.com", 22).Allowed)

	collapsed := Suggest(obs, SuggestConfig{Requests: true, CollapseIDs: true})
	assert.Equal(t, []string{
		"GET api.github.com/a%2Ab",
		"GET api.github.com/repos/acme/widgets/commits/*",
		"GET files.example:8080/dist/x.tar.gz",
		"GET,HEAD api.github.com/repos/acme/widgets",
		"GET,POST api.github.com/repos/acme/widgets/issues/*",
		"github.com:22",
		"registry.npmjs.org",
	}, collapsed.Document.Allow)
	p, err = collapsed.Document.Compile()
	require.NoError(t, err)
	assert.True(t, p.DecideRequest("api.github.com", 443, "POST", "/repos/acme/widgets/issues/43").Allowed)
	assert.False(t, p.DecideRequest("api.github.com", 443, "POST", "/repos/acme/widgets/issues/43/comments").Allowed)
}
