package vault

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/redact"
)

// TestRefreshSecretNeverInjected: a refresh token's rule sends it only in
// the gateway's own grant; a request carrying its placeholder in a header
// or the query, to the token host, is refused.
func TestRefreshSecretNeverInjected(t *testing.T) {
	v, _ := newVault(t)
	rule := Rule{Hosts: []string{"auth.example.com"}, Header: "Authorization", Mode: Refresh, Paths: []string{"/oauth/token"}}
	require.NoError(t, v.Set(Secret{Name: "rt", Rule: rule}, []byte("RT-real-1")))
	a, err := v.Attach("a1", "rt", "REFRESH_TOKEN")
	require.NoError(t, err)

	for _, r := range []*http.Request{
		newRequest(t, "https://auth.example.com/oauth/token?refresh_token="+a.Placeholder, nil),
		newRequest(t, "https://auth.example.com/other?x="+a.Placeholder, nil),
		newRequest(t, "https://auth.example.com/oauth/token", http.Header{"X-Token": {a.Placeholder}}),
	} {
		used, err := v.Inject("a1", r)
		var refused *RefusedError
		require.ErrorAs(t, err, &refused, r.URL.String())
		assert.Contains(t, err.Error(), "refresh grant")
		assert.Empty(t, used)
		assert.NotContains(t, r.URL.RawQuery+r.Header.Get("X-Token"), "RT-real-1")
	}
	// Elsewhere the placeholder goes out as it is, and no header is set.
	r := newRequest(t, "https://api.example.com/?t="+a.Placeholder, nil)
	used, err := v.Inject("a1", r)
	require.NoError(t, err)
	assert.Empty(t, used)
	assert.Contains(t, r.URL.RawQuery, a.Placeholder)
	assert.Empty(t, r.Header.Get("Authorization"))
	// The gateway's grant fills it.
	body, used, err := v.FillBody("a1", "auth.example.com", "/oauth/token", []byte("grant_type=refresh_token&refresh_token="+a.Placeholder))
	require.NoError(t, err)
	assert.Equal(t, []string{"rt"}, used)
	assert.Contains(t, string(body), "RT-real-1")
}

// TestFillBodyOnlyForRefreshRules: an inject rule's secret never goes into
// a body the gateway fills.
func TestFillBodyOnlyForRefreshRules(t *testing.T) {
	v, _ := newVault(t)
	require.NoError(t, v.Set(Secret{Name: "api", Rule: Rule{Hosts: []string{"auth.example.com"}, Header: "Authorization"}}, []byte("API-real")))
	a, err := v.Attach("a1", "api", "API")
	require.NoError(t, err)
	body, used, err := v.FillBody("a1", "auth.example.com", "/oauth/token", []byte("x="+a.Placeholder))
	require.NoError(t, err)
	assert.Empty(t, used)
	assert.NotContains(t, string(body), "API-real")
}

func TestReplaceIn(t *testing.T) {
	v, _ := newVault(t)
	for name, in := range map[string][]string{"default": nil, "headers": {InHeaders}, "query": {InQuery}, "own": {InRuleHeader}} {
		rule := Rule{Hosts: []string{name + ".example.com"}, Header: "Authorization", Template: "Bearer {{.Value}}", ReplaceIn: in}
		require.NoError(t, v.Set(Secret{Name: name, Rule: rule}, []byte("V-"+name)))
		_, err := v.Attach("a1", name, "X_"+strings.ToUpper(name))
		require.NoError(t, err)
	}
	for name, want := range map[string][2]bool{"default": {true, true}, "headers": {true, false}, "query": {false, true}, "own": {false, false}} {
		ph, _ := v.Placeholder("a1", name)
		r := newRequest(t, "https://"+name+".example.com/?q="+ph, http.Header{"X-Echo": {ph}})
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		assert.Equal(t, want[0], r.Header.Get("X-Echo") == "V-"+name, "%s: header", name)
		q, _ := url.ParseQuery(r.URL.RawQuery)
		assert.Equal(t, want[1], q.Get("q") == "V-"+name, "%s: query", name)
		assert.Equal(t, "Bearer V-"+name, r.Header.Get("Authorization"), "%s: the rule's own header is always set", name)
	}
	for _, bad := range [][]string{{"body"}, {InRuleHeader, InQuery}} {
		err := v.Set(Secret{Name: "bad", Rule: Rule{Hosts: []string{"x.example.com"}, Header: "X", ReplaceIn: bad}}, []byte("v"))
		assert.Error(t, err, "%v", bad)
	}
	err := v.Set(Secret{Name: "bad", Rule: Rule{Hosts: []string{"x.example.com"}, Header: "X", Mode: Login, ReplaceIn: []string{InQuery}}}, []byte("v"))
	assert.Error(t, err, "replace_in is for inject rules")
}

// TestRuleHostsAreNames refuses hosts written as URLs or with ports.
func TestRuleHostsAreNames(t *testing.T) {
	v, _ := newVault(t)
	for host, want := range map[string]string{
		"https://api.example.com": "hosts are names, not URLs",
		"api.example.com/v1":      "hosts are names, not URLs",
		"user@api.example.com":    "hosts are names, not URLs",
		"api.example.com:443":     "hosts take no port",
		"*.com":                   "public suffix",
		"127.0.0.1":               "an address",
	} {
		err := v.Set(Secret{Name: "s", Rule: Rule{Hosts: []string{host}, Header: "Authorization"}}, []byte("v"))
		require.Error(t, err, host)
		assert.Contains(t, err.Error(), want, host)
	}
}

// TestTamperErrorsNameFileAndRecord: a changed value names its record; a
// wrong key is told apart from a modified file.
func TestTamperErrorsNameFileAndRecord(t *testing.T) {
	v, st := newVault(t)
	require.NoError(t, v.Set(Secret{Name: "github", Rule: preset(t, "github")}, []byte("ghp_one")))
	require.NoError(t, v.Set(Secret{Name: "openai", Rule: preset(t, "openai")}, []byte("sk-two")))
	good, err := os.ReadFile(st.Path)
	require.NoError(t, err)

	// Change one byte inside github's sealed value.
	i := bytes.Index(good, []byte(`"name": "github"`))
	j := i + bytes.Index(good[i:], []byte(`"sealed": "`)) + len(`"sealed": "`) + 10
	bad := bytes.Clone(good)
	// Another base64 letter: the JSON stays valid, the value does not.
	if bad[j] == 'A' {
		bad[j] = 'B'
	} else {
		bad[j] = 'A'
	}
	require.NoError(t, os.WriteFile(st.Path, bad, 0o600))
	_, err = Open(st, testKey(1), Config{})
	require.ErrorIs(t, err, ErrOpen)
	assert.Contains(t, err.Error(), st.Path)
	assert.Contains(t, err.Error(), `record "github"`)
	assert.Contains(t, err.Error(), "modified")

	// Change a rule, outside any sealed value.
	bad = bytes.Replace(good, []byte(`"api.github.com"`), []byte(`"evil.example.com"`), 1)
	require.NoError(t, os.WriteFile(st.Path, bad, 0o600))
	_, err = Open(st, testKey(1), Config{})
	require.ErrorIs(t, err, ErrOpen)
	assert.Contains(t, err.Error(), st.Path)
	assert.Contains(t, err.Error(), "modified")

	require.NoError(t, os.WriteFile(st.Path, good, 0o600))
	_, err = Open(st, testKey(2), Config{})
	require.ErrorIs(t, err, ErrOpen)
	assert.Contains(t, err.Error(), "wrong master key")
}

// TestRedactorForms: what a covered host echoes comes back with the
// placeholder, in every form, and the rule's rendering too.
func TestRedactorForms(t *testing.T) {
	v, _ := newVault(t)
	rule := Rule{Hosts: []string{"github.com"}, Header: "Authorization", Template: `Basic {{base64 (print "x-access-token:" .Value)}}`}
	require.NoError(t, v.Set(Secret{Name: "git", Rule: rule}, []byte("ghp_abcdefghijklmnop")))
	a, err := v.Attach("a1", "git", "GIT_TOKEN")
	require.NoError(t, err)

	r, err := v.Redactor("a1", "github.com")
	require.NoError(t, err)
	require.NotNil(t, r)
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:ghp_abcdefghijklmnop"))
	out := r.String("echo: " + basic + " raw=ghp_abcdefghijklmnop b64=" + base64.StdEncoding.EncodeToString([]byte("ghp_abcdefghijklmnop")))
	assert.NotContains(t, out, "ghp_abcdefghijklmnop")
	assert.NotContains(t, out, basic[6:])
	assert.Contains(t, out, "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:"+a.Placeholder)))
	assert.Contains(t, out, "raw="+a.Placeholder)

	none, err := v.Redactor("a1", "example.com")
	require.NoError(t, err)
	assert.Nil(t, none, "nothing to redact for a host no rule names")
	other, err := v.Redactor("a2", "github.com")
	require.NoError(t, err)
	assert.Nil(t, other, "another agent has no secret here")
	again, err := v.Redactor("a1", "GitHub.com.")
	require.NoError(t, err)
	assert.Same(t, r, again, "the redactor is made once per state")
}

// TestReplacedValueNeverUnredacted: a stored value replaced (by an
// operator's rotation, or a refresh) after the answer's redactor was
// made is refused, not sent: the answer would echo it unredacted. Sent
// again, the request is redacted with the new value.
func TestReplacedValueNeverUnredacted(t *testing.T) {
	v, _ := newVault(t)
	require.NoError(t, v.Set(Secret{Name: "api", Rule: Rule{Hosts: []string{"api.example"}, Header: "Authorization", Template: "Bearer {{.Value}}"}}, []byte("tok-before-0123456789")))
	a, err := v.Attach("a1", "api", "API_TOKEN")
	require.NoError(t, err)
	red, err := v.Redactor("a1", "api.example")
	require.NoError(t, err)
	require.NoError(t, v.Replace("api", []byte("tok-after-0123456789")))

	inject := func(red *redact.Replacer) (*http.Request, error) {
		req := newRequest(t, "https://api.example/", nil)
		req.Header.Set("Authorization", "Bearer "+a.Placeholder)
		req = req.WithContext(redact.WithReplacer(req.Context(), red))
		_, err := v.Inject("a1", req)
		return req, err
	}
	req, err := inject(red)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused, "a value the answer's redactor does not know was injected")
	assert.NotContains(t, req.Header.Get("Authorization"), "tok-after")

	red, err = v.Redactor("a1", "api.example")
	require.NoError(t, err)
	req, err = inject(red)
	require.NoError(t, err)
	assert.Equal(t, "Bearer tok-after-0123456789", req.Header.Get("Authorization"))
	assert.Equal(t, "echo "+a.Placeholder, red.String("echo tok-after-0123456789"))
}

// TestVersion1FilesOpen: a file written before the key id still opens,
// and is written as version 2 at the next change.
func TestVersion1FilesOpen(t *testing.T) {
	v, st := newVault(t)
	require.NoError(t, v.Set(Secret{Name: "one", Rule: preset(t, "openai")}, []byte("sk-one")))
	data, err := os.ReadFile(st.Path)
	require.NoError(t, err)
	_, body, _ := bytes.Cut(data, []byte("\n"))
	body = bytes.TrimSuffix(body, []byte("\n"))
	v1 := []byte(fileHeaderV1 + fileMAC(testKey(1), body) + "\n" + string(body) + "\n")
	require.NoError(t, os.WriteFile(st.Path, v1, 0o600))
	v2, err := Open(st, testKey(1), Config{})
	require.NoError(t, err)
	require.NoError(t, v2.Set(Secret{Name: "two", Rule: preset(t, "openai")}, []byte("sk-two")))
	data, err = os.ReadFile(st.Path)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(data, []byte(fileHeaderV2+keyID(testKey(1))+" ")))
	_, err = Open(st, testKey(2), Config{})
	assert.ErrorContains(t, err, "wrong master key")
}
