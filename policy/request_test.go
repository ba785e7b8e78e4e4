package policy

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requestPolicy holds the entries: read-only GitHub API for one
// organisation, one OpenAI endpoint, push to one repository, and no
// DELETE anywhere on GitHub.
func requestPolicy(t testing.TB, mode Mode, extra ...string) *Policy {
	p, err := New(Config{Mode: mode, Allow: append([]string{
		"GET,HEAD api.github.com/repos/acme/*",
		"POST api.openai.com/v1/chat/completions",
		"github.com/acme/scratch.git/**",
		"!DELETE *.github.com/**",
		"!DELETE github.com/**",
	}, extra...)})
	require.NoError(t, err)
	return p
}

func TestRequestEntriesAtTheConnection(t *testing.T) {
	p := requestPolicy(t, Allowlist)
	for _, tc := range []struct {
		host     string
		port     uint16
		allowed  bool
		requests bool
		reason   string
	}{
		{"api.github.com", 443, true, true, ReasonRequestRules},
		{"api.github.com", 80, true, true, ReasonRequestRules},
		{"API.GitHub.com.", 443, true, true, ReasonRequestRules},
		{"api.github.com", 22, false, false, ReasonPortNotListed},
		{"api.openai.com", 443, true, true, ReasonRequestRules},
		{"github.com", 443, true, true, ReasonRequestRules},
		{"gist.github.com", 443, false, false, ReasonNoRule}, // a deny request entry allows nothing
		{"evil.example", 443, false, false, ReasonNoRule},
	} {
		d := p.Decide(tc.host, tc.port)
		assert.Equal(t, tc.allowed, d.Allowed, "%s:%d %+v", tc.host, tc.port, d)
		assert.Equal(t, tc.requests, d.Requests, "%s:%d %+v", tc.host, tc.port, d)
		assert.Equal(t, tc.reason, d.Reason, "%s:%d", tc.host, tc.port)
	}
	assert.True(t, p.DecideName("api.github.com").Allowed, "a host with request entries resolves")
	assert.False(t, p.DecideName("gist.github.com").Allowed)

	// Allowed in full elsewhere: the connection is the entry's, and a deny
	// request entry still needs the requests seen.
	full := requestPolicy(t, Allowlist, "*.github.com")
	d := full.Decide("api.github.com", 443)
	assert.Equal(t, Decision{Allowed: true, Rule: "*.github.com", Reason: ReasonAllowedByRule, Name: "api.github.com", Requests: true}, d)
	d = full.Decide("api.openai.com", 443)
	assert.Equal(t, ReasonRequestRules, d.Reason)

	// Open mode allows every host in full; deny request entries still
	// make their hosts' requests judged, others are not.
	open := requestPolicy(t, Open)
	assert.Equal(t, Decision{Allowed: true, Reason: ReasonOpen, Name: "api.github.com", Requests: true}, open.Decide("api.github.com", 443))
	assert.Equal(t, Decision{Allowed: true, Reason: ReasonOpen, Name: "example.com"}, open.Decide("example.com", 443))
}

func TestDecideRequest(t *testing.T) {
	p := requestPolicy(t, Allowlist)
	withWildcard := requestPolicy(t, Allowlist, "*.github.com")
	open := requestPolicy(t, Open)
	for _, tc := range []struct {
		p       *Policy
		host    string
		method  string
		path    string
		allowed bool
		rule    string
		reason  string
	}{
		{p, "api.github.com", "GET", "/repos/acme/widgets", true, "GET,HEAD api.github.com/repos/acme/*", ReasonAllowedByRule},
		{p, "api.github.com", "HEAD", "/repos/acme/widgets?page=2", true, "GET,HEAD api.github.com/repos/acme/*", ReasonAllowedByRule},
		{p, "api.github.com", "GET", "/repos/acme/widgets/", true, "GET,HEAD api.github.com/repos/acme/*", ReasonAllowedByRule},
		{p, "api.github.com", "DELETE", "/repos/ACME/Widgets", false, "!DELETE *.github.com/**", ReasonDenyEntry},
		{p, "api.github.com", "GET", "/repos/acme/widgets/issues", false, "", ReasonNoRequestRule},
		{p, "api.github.com", "GET", "/repos/other/widgets", false, "", ReasonNoRequestRule},
		{p, "api.github.com", "POST", "/repos/acme/widgets", false, "", ReasonNoRequestRule},
		{p, "api.github.com", "get", "/repos/acme/widgets", false, "", ReasonNoRequestRule}, // methods are case-sensitive
		{p, "api.github.com", "DELETE", "/repos/acme/widgets", false, "!DELETE *.github.com/**", ReasonDenyEntry},
		{p, "api.github.com", "delete", "/repos/acme/widgets", false, "!DELETE *.github.com/**", ReasonDenyEntry},
		{p, "api.openai.com", "POST", "/v1/chat/completions", true, "POST api.openai.com/v1/chat/completions", ReasonAllowedByRule},
		{p, "api.openai.com", "POST", "/v1/files", false, "", ReasonNoRequestRule},
		{p, "github.com", "GET", "/acme/scratch.git/info/refs?service=git-receive-pack", true, "github.com/acme/scratch.git/**", ReasonAllowedByRule},
		{p, "github.com", "POST", "/acme/scratch.git/git-receive-pack", true, "github.com/acme/scratch.git/**", ReasonAllowedByRule},
		{p, "github.com", "POST", "/acme/other.git/git-receive-pack", false, "", ReasonNoRequestRule},
		{p, "github.com", "DELETE", "/acme/scratch.git", false, "!DELETE github.com/**", ReasonDenyEntry},
		{p, "evil.example", "GET", "/", false, "", ReasonNoRule},
		// A host allowed in full: every request but the denied ones.
		{withWildcard, "api.github.com", "POST", "/repos/acme/widgets/issues", true, "*.github.com", ReasonAllowedByRule},
		{withWildcard, "api.github.com", "DELETE", "/repos/acme/widgets", false, "!DELETE *.github.com/**", ReasonDenyEntry},
		{withWildcard, "api.github.com", "GET", "/x/%zz", false, "", ReasonPathInvalidEscape}, // a path that needs judging must normalise
		{open, "api.github.com", "DELETE", "/x", false, "!DELETE *.github.com/**", ReasonDenyEntry},
		{open, "example.com", "DELETE", "/x/%zz", true, "", ReasonOpen}, // no request entry: the path is not consulted
	} {
		d := tc.p.DecideRequest(tc.host, 443, tc.method, tc.path)
		assert.Equal(t, tc.allowed, d.Allowed, "%s %s%s: %+v", tc.method, tc.host, tc.path, d)
		assert.Equal(t, tc.rule, d.Rule, "%s %s%s", tc.method, tc.host, tc.path)
		assert.Equal(t, tc.reason, d.Reason, "%s %s%s", tc.method, tc.host, tc.path)
	}
}

// TestRequestReportMode: report mode allows what a request entry would
// refuse, saying why.
func TestRequestReportMode(t *testing.T) {
	p, err := New(Config{Report: true, Allow: []string{"GET api.test/a/*", "!DELETE api.test/**"}})
	require.NoError(t, err)
	d := p.DecideRequest("api.test", 443, "DELETE", "/a/b")
	assert.Equal(t, Decision{Allowed: true, Report: true, Rule: "!DELETE api.test/**", Reason: ReasonDenyEntry, Name: "api.test"}, d)
	d = p.DecideRequest("api.test", 443, "GET", "/b")
	assert.True(t, d.Allowed && d.Report)
	assert.Equal(t, ReasonNoRequestRule, d.Reason)
}

// TestPathBypasses: the ways people get a request past a path-based
// proxy, against an allow entry for one directory and a deny entry for
// another. Each is refused: by a reason of its own, or by the entries
// once the path is read as the server reads it. Dot segments are refused
// rather than resolved: the path goes upstream as it came, and servers
// resolve them differently.
func TestPathBypasses(t *testing.T) {
	p, err := New(Config{Allow: []string{
		"GET,DELETE api.test/public/*",
		"DELETE api.test/admin/keep",
		"!DELETE api.test/admin/**",
	}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name, method, path, reason string
	}{
		{"dot-dot out of the allowed directory", "GET", "/public/../admin/x", ReasonPathDotSegment},
		{"encoded dot-dot", "GET", "/public/%2e%2e/admin/x", ReasonPathDotSegment},
		{"upper-case encoded dot-dot", "GET", "/public/%2E%2E/admin/x", ReasonPathDotSegment},
		{"dot-dot with a path parameter (Tomcat reads it as .., others as a name)", "GET", "/public/..;/admin/x", ReasonPathDotSegment},
		{"deny: dot-dot with a path parameter into an allowed directory", "DELETE", "/admin/..;/public/x", ReasonPathDotSegment},
		{"deny: an empty segment before dot-dot (RFC 3986 keeps it)", "DELETE", "/admin//../public/x", ReasonPathDotSegment},
		{"deny: a trailing empty segment and dot-dot", "DELETE", "/public/x//..", ReasonPathDotSegment},
		{"a dot segment", "GET", "/public/./x", ReasonPathDotSegment},
		{"dot-dot behind an encoded slash", "GET", "/public/..%2Fadmin", ReasonPathEncodedDots},
		{"dot-dot behind an encoded slash, lower case", "GET", "/public/x%2f..%2f..%2fadmin", ReasonPathEncodedDots},
		{"above the root", "GET", "/public/../../admin", ReasonPathDotSegment},
		{"encoded slash as a second segment", "GET", "/public/a%2Fb/c", ReasonNoRequestRule},
		{"encoded slash stretching a *", "GET", "/public/x%2Fsecret%2Fkeys", ReasonNoRequestRule},
		{"deny: encoded letters", "DELETE", "/%61dmin/x", ReasonDenyEntry},
		{"deny: path parameter", "DELETE", "/admin;jsessionid=1/x", ReasonDenyEntry},
		{"deny: repeated slashes", "DELETE", "//admin//x", ReasonDenyEntry},
		{"deny: dot segment", "DELETE", "/./admin/x", ReasonPathDotSegment},
		{"deny: through an allowed directory", "DELETE", "/public/../admin/x", ReasonPathDotSegment},
		{"deny: case differs (servers that fold case)", "DELETE", "/ADMIN/x", ReasonDenyEntry},
		{"deny: encoded slash in place of a boundary", "DELETE", "/admin%2Fx", ReasonDenyEntry},
		{"deny: lower-case method", "delete", "/admin/x", ReasonDenyEntry},
		{"deny: an exact allow entry under a deny entry", "DELETE", "/admin/keep", ReasonDenyEntry},
		{"NUL", "GET", "/public/x%00.json", ReasonPathControl},
		{"raw control character", "GET", "/public/x\r\n", ReasonPathControl},
		{"backslash", "GET", "/public\\..\\admin", ReasonPathBackslash},
		{"encoded backslash", "GET", "/public/..%5Cadmin", ReasonPathBackslash},
		{"invalid escape", "GET", "/public/%zz", ReasonPathInvalidEscape},
		{"truncated escape", "GET", "/public/%4", ReasonPathInvalidEscape},
		{"IIS %u escape", "GET", "/public/%u002e%u002e/admin", ReasonPathInvalidEscape},
		{"overlong UTF-8 slash", "GET", "/public/..%c0%afadmin", ReasonPathNotUTF8},
		{"fragment", "GET", "/public/x#/../../admin", ReasonPathFragment},
		{"absolute form", "GET", "http://api.test/public/x", ReasonPathNotOrigin},
		{"asterisk form", "OPTIONS", "*", ReasonPathNotOrigin},
		{"empty", "GET", "", ReasonPathNotOrigin},
		{"too deep", "GET", "/public" + strings.Repeat("/x", MaxPathSegments), ReasonPathTooDeep},
		{"case differs (paths are case-sensitive)", "GET", "/Public/x", ReasonNoRequestRule},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := p.DecideRequest("api.test", 443, tc.method, tc.path)
			assert.False(t, d.Allowed, "%+v", d)
			assert.Equal(t, tc.reason, d.Reason)
		})
	}
	// And what these entries allow, so that the refusals above are theirs.
	for _, path := range []string{"/public/x", "/public/x/", "/public//x", "/public/x;v=1", "/public/%78", "/public/x?../../admin"} {
		assert.True(t, p.DecideRequest("api.test", 443, "GET", path).Allowed, path)
	}
}

// TestEncodedSlashUnderDoubleStar: an encoded slash is allowed where the
// pattern takes any depth, as GitLab's project paths need.
func TestEncodedSlashUnderDoubleStar(t *testing.T) {
	p, err := New(Config{Allow: []string{"GET gitlab.test/api/v4/projects/**"}})
	require.NoError(t, err)
	assert.True(t, p.DecideRequest("gitlab.test", 443, "GET", "/api/v4/projects/group%2Fproject/issues").Allowed)
}

func TestRequestEntryErrors(t *testing.T) {
	for _, tc := range []struct{ entry, want string }{
		{"GET api.test", "needs a path"},
		{"GET 203.0.113.1/x", "not an address"},
		{"GET */x", "not an address"},
		{"G@T api.test/x", "not an HTTP method"},
		{"GET api.test/a/**/b/**/c/**", `at most 2 "**"`},
		{"GET api.test/a*/b", "whole segments only"},
		{"GET api.test/a/../b", ". or .. segment"},
		{"GET api.test/a;x/b", "parameters are dropped"},
		{"GET api.test/%zz", "invalid percent-escape"},
		{"GET https://api.test/x", "entries are host[:port]"},
	} {
		_, err := New(Config{Allow: []string{tc.entry}})
		if assert.Error(t, err, tc.entry) {
			assert.Contains(t, err.Error(), tc.want, tc.entry)
		}
	}
}

// TestDecideRequestAllocatesNothing: a canonical path on a host with
// request entries is judged without allocating.
func TestDecideRequestAllocatesNothing(t *testing.T) {
	p := manyRequestRules(t, 1000)
	allocs := testing.AllocsPerRun(100, func() {
		if !p.DecideRequest("api.test", 443, "GET", "/orgs/org999/repos/r1/issues").Allowed {
			panic("denied")
		}
	})
	assert.Zero(t, allocs)
}

// manyRequestRules is a policy with n request entries on one host.
func manyRequestRules(t testing.TB, n int) *Policy {
	var allow []string
	for i := range n {
		switch i % 4 {
		case 0:
			allow = append(allow, fmt.Sprintf("GET,HEAD api.test/orgs/org%d/repos/*/issues", i))
		case 1:
			allow = append(allow, fmt.Sprintf("POST api.test/orgs/org%d/**", i))
		case 2:
			allow = append(allow, fmt.Sprintf("!DELETE api.test/orgs/org%d/**", i))
		default:
			allow = append(allow, fmt.Sprintf("GET,HEAD api.test/orgs/org%d/repos/*/issues", i))
		}
	}
	p, err := New(Config{Allow: allow})
	require.NoError(t, err)
	return p
}

func BenchmarkDecideRequest1k(b *testing.B) {
	p := manyRequestRules(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		p.DecideRequest("api.test", 443, "GET", "/orgs/org999/repos/r1/issues")
	}
}

// FuzzAppendPath: whatever a path is, a normalised one holds no empty,
// "." or ".." segment and no control character, and normalising it again
// (each segment escaped and joined) gives the same segments.
func FuzzAppendPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/a/../b", "/a/%2e%2e/b", "/a;x/..;/b", "/a%2Fb", "//a//b/", "/%zz", "/a\\b", "/%c0%af", "/a?b#c", "/a//../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		segs, why := appendPath(nil, path)
		if why != "" {
			return
		}
		require.LessOrEqual(t, len(segs), MaxPathSegments)
		escaped := make([]string, len(segs))
		for i, s := range segs {
			require.NotContains(t, []string{"", ".", ".."}, s)
			for _, c := range []byte(s) {
				require.False(t, c < 0x20 || c == 0x7f || c == '\\', "segment %q of %q", s, path)
			}
			escaped[i] = url.PathEscape(s)
		}
		again, why := appendPath(nil, "/"+strings.Join(escaped, "/"))
		require.Empty(t, why, "%q normalised to %q, which does not normalise", path, segs)
		assert.True(t, slices.Equal(segs, again), "%q normalised to %q, and again to %q", path, segs, again)
	})
}
