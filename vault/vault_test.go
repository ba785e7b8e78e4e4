package vault

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// TestXChaChaVector checks open against the AEAD_XChaCha20_Poly1305 test
// vector of draft-irtf-cfrg-xchacha (appendix A.3.1), in the vault's
// nonce || ciphertext || tag layout, and that seal round-trips.
func TestXChaChaVector(t *testing.T) {
	key := mustHex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f")
	nonce := mustHex("404142434445464748494a4b4c4d4e4f5051525354555657")
	aad := mustHex("50515253c0c1c2c3c4c5c6c7")
	plaintext := []byte("Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.")
	ct := mustHex("bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb" +
		"731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452" +
		"2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9" +
		"21f9664c97637da9768812f615c68b13b52e")
	tag := mustHex("c0875924c1c7987947deafd8780acf49")
	sealed := append(append(append([]byte{}, nonce...), ct...), tag...)
	got, err := open(key, aad, sealed)
	require.NoError(t, err, "open(vector)")
	assert.Equal(t, plaintext, got, "open(vector)")
	s1, err := seal(key, aad, plaintext)
	require.NoError(t, err)
	s2, _ := seal(key, aad, plaintext)
	assert.NotEqual(t, s1[:24], s2[:24], "two seals used the same nonce")
	got, err = open(key, aad, s1)
	assert.NoError(t, err, "round trip")
	assert.Equal(t, plaintext, got, "round trip")
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x01
		_, err := open(key, aad, bad)
		assert.ErrorIs(t, err, ErrOpen, "flipping byte %d", i)
	}
	_, err = open(key, []byte("other record"), sealed)
	assert.ErrorIs(t, err, ErrOpen, "opened with other associated data")
	_, err = open(key, aad, sealed[:30])
	assert.ErrorIs(t, err, ErrOpen, "opened a truncated record")
}

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func newVault(t *testing.T) (*Vault, FileStorage) {
	t.Helper()
	st := FileStorage{Path: filepath.Join(t.TempDir(), "secrets.json")}
	v, err := Open(st, testKey(1), Config{PlaceholderPrefix: "agenthold"})
	require.NoError(t, err)
	return v, st
}

func preset(t *testing.T, name string) Rule {
	r, ok := Preset(name)
	require.True(t, ok, "no preset %q", name)
	return r
}

func TestPersistAndReopen(t *testing.T) {
	v, st := newVault(t)
	require.NoError(t, v.Set(Secret{Name: "gh", Rule: preset(t, "github")}, []byte("ghp_secret1")))
	a, err := v.Attach("a1", "gh", "GITHUB_TOKEN")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(a.Placeholder, "agenthold-placeholder-"), "placeholder %q", a.Placeholder)
	assert.Len(t, a.Placeholder, len("agenthold-placeholder-")+32, "placeholder")
	data, _ := os.ReadFile(st.Path)
	// Not NotContains: on failure it would print the file, value and all.
	assert.False(t, bytes.Contains(data, []byte("ghp_secret1")), "the value is in the file in clear")
	v2, err := Open(st, testKey(1), Config{})
	require.NoError(t, err)
	got := v2.Attachments("a1")
	if assert.Len(t, got, 1, "attachments after reopen") {
		assert.Equal(t, a, got[0], "attachments after reopen")
	}
	l := v2.List()
	if assert.Len(t, l, 1, "list") {
		assert.Equal(t, "gh", l[0].Name, "list")
		assert.Equal(t, "Authorization", l[0].Rule.Header, "list")
	}
	// Attaching again keeps the placeholder.
	again, _ := v2.Attach("a1", "gh", "GH_TOKEN")
	assert.Equal(t, a.Placeholder, again.Placeholder, "re-attach")
	assert.Equal(t, "GH_TOKEN", again.Env, "re-attach")
	other, _ := v2.Attach("a2", "gh", "GITHUB_TOKEN")
	assert.NotEqual(t, a.Placeholder, other.Placeholder, "two attachments share a placeholder")
}

func TestWrongKeyAndTampering(t *testing.T) {
	v, st := newVault(t)
	for _, n := range []string{"one", "two"} {
		require.NoError(t, v.Set(Secret{Name: n, Rule: preset(t, "openai")}, []byte("sk-"+n)))
	}
	_, err := v.Attach("a1", "one", "OPENAI_API_KEY")
	require.NoError(t, err)
	good, _ := os.ReadFile(st.Path)
	_, err = Open(st, testKey(2), Config{})
	assert.ErrorIs(t, err, ErrOpen, "wrong key")
	assert.ErrorContains(t, err, "wrong master key", "wrong key")
	assert.ErrorContains(t, err, st.Path, "wrong key")
	// Every single-byte change of the file is refused.
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x20
		require.NoError(t, os.WriteFile(st.Path, bad, 0o600))
		_, err := Open(st, testKey(1), Config{})
		assert.Error(t, err, "a file changed at byte %d (%q) opened", i, good[i])
	}
	// Truncations too.
	for _, n := range []int{0, 1, len(good) / 2, len(good) - 2, len(good) - 1} {
		os.WriteFile(st.Path, good[:n], 0o600)
		_, err := Open(st, testKey(1), Config{})
		assert.Error(t, err, "a file truncated to %d bytes opened", n)
	}
}

// TestSwappedRecords moves sealed values between records, recomputing the
// file's MAC as only a key holder could, to show that each value is bound
// to its own record: the error names the record.
func TestSwappedRecords(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "one", Rule: preset(t, "openai")}, []byte("sk-one"))
	v.Set(Secret{Name: "two", Rule: preset(t, "openai")}, []byte("sk-two"))
	data, _ := os.ReadFile(st.Path)
	_, body, _ := bytes.Cut(data, []byte("\n"))
	var d document
	require.NoError(t, json.Unmarshal(body, &d))
	cases := map[string]func(d *document){
		"values swapped":    func(d *document) { d.Secrets[0].Sealed, d.Secrets[1].Sealed = d.Secrets[1].Sealed, d.Secrets[0].Sealed },
		"rule hosts edited": func(d *document) { d.Secrets[0].Rule.Hosts = []string{"evil.example"} },
		"owner changed":     func(d *document) { d.Secrets[0].Owner = "someone" },
		"renamed":           func(d *document) { d.Secrets[0].Name = "three" },
	}
	for name, tamper := range cases {
		t.Run(name, func(t *testing.T) {
			c := d
			c.Secrets = append([]storedSecret(nil), d.Secrets...)
			tamper(&c)
			out, err := c.encode(testKey(1))
			require.NoError(t, err)
			os.WriteFile(st.Path, out, 0o600)
			_, err = Open(st, testKey(1), Config{})
			assert.ErrorIs(t, err, ErrOpen, "Open: want ErrOpen naming the record")
			assert.ErrorContains(t, err, "record \"", "Open: want ErrOpen naming the record")
		})
	}
}

func TestRotate(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "one", Rule: preset(t, "anthropic")}, []byte("sk-ant-1"))
	require.NoError(t, v.Rotate(testKey(9)))
	_, err := Open(st, testKey(1), Config{})
	assert.Error(t, err, "the old key still opens the vault")
	v2, err := Open(st, testKey(9), Config{})
	require.NoError(t, err)
	a, _ := v2.Attach("a1", "one", "ANTHROPIC_API_KEY")
	req := newRequest(t, "https://api.anthropic.com/v1/messages", nil)
	used, err := v2.Inject("a1", req)
	assert.NoError(t, err, "inject after rotation")
	assert.Len(t, used, 1, "inject after rotation: secrets used")
	assert.Equal(t, "sk-ant-1", req.Header.Get("x-api-key"), "inject after rotation (placeholder %s)", a.Placeholder)
	assert.Error(t, v2.Rotate([]byte("short")), "rotated to a short key")
}

func TestCrashLeftovers(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "one", Rule: preset(t, "openai")}, []byte("sk-1"))
	leftover := st.Path + ".tmp-deadbeef"
	require.NoError(t, os.WriteFile(leftover, []byte(`{"format":"egress-vault","vers`), 0o600))
	_, err := Open(st, testKey(1), Config{})
	require.NoError(t, err, "a partial temporary file broke loading")
	_, err = os.Stat(leftover)
	assert.ErrorIs(t, err, fs.ErrNotExist, "the partial temporary file was not removed")
}

func TestKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "master.key")
	k1, err := LoadKeyFile(path)
	require.NoError(t, err, "create")
	// Not Len or Equal on keys: on failure they would print the key.
	assert.Equal(t, KeySize, len(k1), "create: key length")
	fi, _ := os.Stat(path)
	di, _ := os.Stat(dir)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "modes: file")
	assert.Equal(t, os.FileMode(0o700), di.Mode().Perm(), "modes: dir")
	k2, err := LoadKeyFile(path)
	assert.NoError(t, err, "reload")
	assert.True(t, bytes.Equal(k1, k2), "reload: a different key")
	os.Chmod(path, 0o640)
	_, err = LoadKeyFile(path)
	assert.ErrorContains(t, err, "chmod 600", "group-readable key file")
	os.Chmod(path, 0o600)
	os.WriteFile(path, []byte("short"), 0o600)
	_, err = LoadKeyFile(path)
	assert.Error(t, err, "short key file accepted")
}

func TestParseKey(t *testing.T) {
	k := testKey(7)
	for _, s := range []string{hex.EncodeToString(k), "  " + hex.EncodeToString(k) + "\n", "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=", "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"} {
		got, err := ParseKey(s)
		assert.NoError(t, err, "ParseKey(%q)", s)
		assert.Equal(t, k, got, "ParseKey(%q)", s)
	}
	for _, s := range []string{"", "abcd", hex.EncodeToString(k[:31]), "not a key at all!"} {
		_, err := ParseKey(s)
		assert.Error(t, err, "ParseKey(%q) accepted it", s)
	}
	t.Setenv("EGRESS_TEST_KEY", hex.EncodeToString(k))
	got, err := KeyFromEnv("EGRESS_TEST_KEY")
	assert.NoError(t, err, "KeyFromEnv")
	assert.True(t, bytes.Equal(got, k), "KeyFromEnv: a different key") // not Equal: it would print the key
	_, err = KeyFromEnv("EGRESS_TEST_KEY_UNSET")
	assert.ErrorIs(t, err, fs.ErrNotExist, "unset variable")
	_, err = Open(FileStorage{Path: "/nonexistent"}, k[:16], Config{})
	assert.Error(t, err, "Open accepted a short key")
}

func TestRuleChecks(t *testing.T) {
	bad := []Rule{
		{Header: "Authorization", Template: "{{.Value}}"},                                  // no host
		{Hosts: []string{"api.example.com"}, Header: "Bad Header", Template: "{{.Value}}"}, // header name
		{Hosts: []string{"api.example.com"}, Header: "X", Template: "{{.Value"},            // parse error
		{Hosts: []string{"api.example.com"}, Header: "X", Template: "static"},              // no .Value
		{Hosts: []string{"api.example.com"}, Header: "X", Template: "{{.Value}}\n"},        // newline in value
		{Hosts: []string{"api.example.com"}, Header: "X", Template: "{{.Other}}{{.Value}}"},
		{Hosts: []string{"api.example.com"}, Header: "X", Template: `{{env "HOME"}}{{.Value}}`},
		{Hosts: []string{"api.example.com"}, Header: "X", Mode: "sometimes"},
		{Hosts: []string{"api.example.com"}, Header: "X", Paths: []string{"v1"}},
		{Hosts: []string{"api.example.com"}, Header: "X", Paths: []string{"/v1/../admin"}},
		{Hosts: []string{"api.example.com"}, Header: "X", Paths: []string{"/v1//x"}},
		{Hosts: []string{"*.com*"}, Header: "X"},
		{Hosts: []string{"bad host"}, Header: "X"},
	}
	for i, r := range bad {
		_, err := r.compile()
		assert.Error(t, err, "rule %d (%+v) accepted", i, r)
	}
	for _, name := range PresetNames() {
		r, _ := Preset(name)
		_, err := r.compile()
		assert.NoError(t, err, "preset %s", name)
	}
	v, _ := newVault(t)
	assert.Error(t, v.Set(Secret{Name: "x", Rule: preset(t, "openai")}, []byte("line\r\nInjected: yes")), "a value that would split a header was stored")
	assert.Error(t, v.Set(Secret{Name: "../x", Rule: preset(t, "openai")}, []byte("v")), "a bad name was stored")
	assert.Error(t, v.Set(Secret{Name: "x", Rule: preset(t, "openai")}, nil), "an empty value was stored")
}

func newRequest(t testing.TB, rawURL string, header http.Header) *http.Request {
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	if header == nil {
		header = http.Header{}
	}
	return &http.Request{Method: "GET", URL: u, Host: u.Host, Header: header}
}

func TestInjection(t *testing.T) {
	v, _ := newVault(t)
	set := func(name string, r Rule, value string) {
		require.NoError(t, v.Set(Secret{Name: name, Rule: r}, []byte(value)))
	}
	// The presets that put a value in a header; aws and github-app,
	// which sign or mint, have tests of their own.
	var headerPresets []string
	for _, name := range PresetNames() {
		if m := preset(t, name).Mode; m != AWSSigV4 && m != GitHubApp {
			headerPresets = append(headerPresets, name)
			set(name, preset(t, name), "VAL-"+name)
		}
	}
	set("login", Rule{Hosts: []string{"chatgpt.com", "*.openai.com"}, Header: "Authorization", Mode: Login, Paths: []string{"/backend-api"}}, "LOGIN-TOKEN")
	set("wild", Rule{Hosts: []string{"*.example.com"}, Header: "X-Key"}, "WILD-VALUE")
	ph := map[string]string{}
	for _, name := range append(headerPresets, "login", "wild") {
		a, err := v.Attach("a1", name, strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
		require.NoError(t, err)
		ph[name] = a.Placeholder
	}
	otherAgent, _ := v.Attach("a2", "openai", "OPENAI_API_KEY")

	type check struct{ header, want string }
	tests := []struct {
		name   string
		agent  string
		url    string
		header http.Header
		used   string
		checks []check
		query  string // want the raw query, if set
	}{
		{"anthropic", "a1", "https://api.anthropic.com/v1/messages", nil, "anthropic", []check{{"x-api-key", "VAL-anthropic"}}, ""},
		{"openai", "a1", "https://api.openai.com/v1/chat", nil, "openai", []check{{"Authorization", "Bearer VAL-openai"}}, ""},
		{"github api", "a1", "https://api.github.com/user", nil, "github", []check{{"Authorization", "Bearer VAL-github"}}, ""},
		{"github git", "a1", "https://github.com/o/r.git/info/refs", nil, "github-git", []check{{"Authorization", "Basic eC1hY2Nlc3MtdG9rZW46VkFMLWdpdGh1Yi1naXQ="}}, ""},
		{"gitlab api path", "a1", "https://gitlab.com/api/v4/user", nil, "gitlab,gitlab-git", []check{{"PRIVATE-TOKEN", "VAL-gitlab"}}, ""},
		{"gitlab outside api path", "a1", "https://gitlab.com/apix", nil, "gitlab-git", []check{{"PRIVATE-TOKEN", ""}}, ""},
		{"openrouter", "a1", "https://openrouter.ai/api/v1/chat", nil, "openrouter", []check{{"Authorization", "Bearer VAL-openrouter"}}, ""},
		{"host case and dot", "a1", "https://API.OpenAI.com./v1", nil, "openai", []check{{"Authorization", "Bearer VAL-openai"}}, ""},
		{"host with port", "a1", "https://api.openai.com:443/v1", nil, "openai", []check{{"Authorization", "Bearer VAL-openai"}}, ""},
		{"unnamed host gets nothing", "a1", "https://evil.example/", http.Header{"Authorization": {"Bearer " + ph["openai"]}}, "", []check{{"Authorization", "Bearer " + ph["openai"]}}, ""},
		{"lookalike host", "a1", "https://api.openai.com.evil.example/", nil, "", []check{{"Authorization", ""}}, ""},
		{"wildcard subdomain", "a1", "https://a.b.example.com/", nil, "wild", []check{{"X-Key", "WILD-VALUE"}}, ""},
		{"wildcard apex", "a1", "https://example.com/", nil, "", []check{{"X-Key", ""}}, ""},
		{"placeholder in a longer value", "a1", "https://api.openai.com/v1", http.Header{"X-Extra": {"prefix " + ph["openai"] + " suffix"}}, "openai", []check{{"X-Extra", "prefix VAL-openai suffix"}}, ""},
		{"header present twice", "a1", "https://api.openai.com/v1", http.Header{"Authorization": {"Bearer " + ph["openai"], "Bearer other"}}, "openai", []check{{"Authorization", "Bearer VAL-openai"}}, ""},
		{"placeholder in query", "a1", "https://api.openai.com/v1?key=" + ph["openai"] + "&x=1", nil, "openai", nil, "key=VAL-openai&x=1"},
		{"placeholder of another agent", "a1", "https://api.openai.com/v1", http.Header{"X-Other": {otherAgent.Placeholder}}, "openai", []check{{"X-Other", otherAgent.Placeholder}}, ""},
		{"unknown agent", "nobody", "https://api.openai.com/v1", http.Header{"Authorization": {"Bearer " + ph["openai"]}}, "", []check{{"Authorization", "Bearer " + ph["openai"]}}, ""},
		{"login replaces inside its header", "a1", "https://chatgpt.com/backend-api/me", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "login", []check{{"Authorization", "Bearer LOGIN-TOKEN"}}, ""},
		{"login never adds", "a1", "https://chatgpt.com/backend-api/me", nil, "", []check{{"Authorization", ""}}, ""},
		{"login only its header", "a1", "https://chatgpt.com/backend-api/me", http.Header{"X-Other": {ph["login"]}}, "", []check{{"X-Other", ph["login"]}, {"Authorization", ""}}, ""},
		{"login path limit", "a1", "https://chatgpt.com/other", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path segment", "a1", "https://chatgpt.com/backend-apix", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with dot segments", "a1", "https://chatgpt.com/backend-api/../admin", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with encoded dot segments", "a1", "https://chatgpt.com/backend-api/%2e%2e/admin", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with a dot segment", "a1", "https://chatgpt.com/backend-api/./me", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with a semicolon", "a1", "https://chatgpt.com/backend-api/..;/admin", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with a backslash", "a1", "https://chatgpt.com/backend-api/..%5cadmin", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with an empty segment", "a1", "https://chatgpt.com/backend-api//me", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "", []check{{"Authorization", "Bearer " + ph["login"]}}, ""},
		{"login path with a trailing slash", "a1", "https://chatgpt.com/backend-api/me/", http.Header{"Authorization": {"Bearer " + ph["login"]}}, "login", []check{{"Authorization", "Bearer LOGIN-TOKEN"}}, ""},
		{"gitlab api path with dot segments", "a1", "https://gitlab.com/api/../users/sign_in", nil, "gitlab-git", []check{{"PRIVATE-TOKEN", ""}}, ""},
		{"login query untouched", "a1", "https://chatgpt.com/backend-api/x?t=" + ph["login"], http.Header{"Authorization": {"Bearer " + ph["login"]}}, "login", nil, "t=" + ph["login"]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := newRequest(t, tt.url, tt.header)
			used, err := v.Inject(tt.agent, req)
			require.NoError(t, err)
			assert.Equal(t, tt.used, strings.Join(used, ","), "used")
			for _, c := range tt.checks {
				assert.Equal(t, c.want, req.Header.Get(c.header), c.header)
			}
			if tt.query != "" {
				assert.Equal(t, tt.query, req.URL.RawQuery, "query")
			}
			assert.LessOrEqual(t, len(req.Header.Values("Authorization")), 1, "Authorization sent more than once")
		})
	}
}

func TestDeleteAndDetach(t *testing.T) {
	v, _ := newVault(t)
	v.Set(Secret{Name: "gh", Rule: preset(t, "github")}, []byte("ghp_1"))
	a, _ := v.Attach("a1", "gh", "GITHUB_TOKEN")
	require.NoError(t, v.Detach("a1", "gh"))
	req := newRequest(t, "https://api.github.com/user", http.Header{"Authorization": {"Bearer " + a.Placeholder}})
	used, _ := v.Inject("a1", req)
	assert.Empty(t, used, "a detached placeholder was replaced")
	// Not Equal: on failure it would print the header, secret and all.
	assert.True(t, req.Header.Get("Authorization") == "Bearer "+a.Placeholder, "a detached placeholder was replaced")
	v.Attach("a1", "gh", "GITHUB_TOKEN")
	require.NoError(t, v.Delete("gh"))
	assert.Empty(t, v.Attachments("a1"), "delete left the secret's attachments")
	assert.Empty(t, v.List(), "delete left the secret")
	assert.Error(t, v.Delete("gh"), "deleted a missing secret")
}

func TestSetRuleKeepsValue(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "k", Rule: Rule{Hosts: []string{"a.example"}, Header: "X-Key"}}, []byte("V1"))
	v.Attach("a1", "k", "K")
	require.NoError(t, v.SetRule("k", Rule{Hosts: []string{"b.example"}, Header: "X-Key", Template: "T {{.Value}}"}))
	v2, err := Open(st, testKey(1), Config{})
	require.NoError(t, err)
	req := newRequest(t, "https://b.example/", nil)
	used, _ := v2.Inject("a1", req)
	assert.Len(t, used, 1, "after SetRule: secrets used")
	assert.Equal(t, "T V1", req.Header.Get("X-Key"), "after SetRule")
	req = newRequest(t, "https://a.example/", nil)
	used, _ = v2.Inject("a1", req)
	assert.Empty(t, used, "the old host still gets the value")
}

func FuzzDecodeDocument(f *testing.F) {
	st := FileStorage{Path: filepath.Join(f.TempDir(), "v.json")}
	v, _ := Open(st, testKey(1), Config{})
	v.Set(Secret{Name: "one", Rule: Rule{Hosts: []string{"a.example"}, Header: "X"}}, []byte("v"))
	v.Attach("a1", "one", "ONE")
	good, _ := os.ReadFile(st.Path)
	f.Add(good)
	f.Add([]byte("egress-vault v1 00\n{}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := decodeDocument(data, testKey(1), "test")
		if err != nil {
			return
		}
		// Whatever decodes was written with the key: it re-encodes the same.
		out, err := d.encode(testKey(1))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeDocument(out, testKey(1), "test"); err != nil {
			t.Fatalf("re-encoded document does not decode: %v", err)
		}
	})
}

func FuzzTemplate(f *testing.F) {
	for _, s := range []string{"{{.Value}}", "Bearer {{.Value}}", `Basic {{base64 (print "x:" .Value)}}`, "{{printf \"%q\" .Value}}", "{{range .Value}}{{end}}", "{{template \"x\"}}"} {
		f.Add(s, "secret")
	}
	f.Fuzz(func(t *testing.T, tmpl, value string) {
		r := Rule{Hosts: []string{"a.example"}, Header: "X", Template: tmpl}
		c, err := r.compile()
		if err != nil {
			return
		}
		out, err := c.render(value)
		if err != nil {
			if strings.Contains(err.Error(), value) && value != "" {
				t.Fatalf("an error reveals the value: %v", err)
			}
			return
		}
		if strings.ContainsAny(out, "\r\n\x00") {
			t.Fatalf("rendered a value that splits headers: %q", out)
		}
	})
}

func BenchmarkInject(b *testing.B) {
	st := FileStorage{Path: filepath.Join(b.TempDir(), "v.json")}
	v, _ := Open(st, testKey(1), Config{})
	for _, name := range PresetNames() {
		r, _ := Preset(name)
		v.Set(Secret{Name: name, Rule: r}, []byte("sk-0123456789abcdef0123456789abcdef"))
		v.Attach("a1", name, strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
	u, _ := url.Parse("https://api.openai.com/v1/chat/completions")
	b.ReportAllocs()
	for b.Loop() {
		req := &http.Request{Method: "POST", URL: u, Host: "api.openai.com", Header: http.Header{"Content-Type": {"application/json"}}}
		// b.Fatal, not require, inside the timed loop: require calls
		// b.Helper (a lock and a stack walk) each time.
		if used, err := v.Inject("a1", req); err != nil || len(used) != 1 {
			b.Fatal(used, err)
		}
	}
}

func TestFillBodyPlaceholderReplace(t *testing.T) {
	v, _ := newVault(t)
	rule := Rule{Hosts: []string{"auth.example"}, Header: "Authorization", Mode: Refresh, Paths: []string{"/oauth/token"}}
	require.NoError(t, v.Set(Secret{Name: "refresh", Rule: rule}, []byte("RT-1")))
	a, _ := v.Attach("a1", "refresh", "REFRESH")
	ph, ok := v.Placeholder("a1", "refresh")
	assert.True(t, ok, "Placeholder")
	assert.Equal(t, a.Placeholder, ph, "Placeholder")
	_, ok = v.Placeholder("a2", "refresh")
	assert.False(t, ok, "another agent has a placeholder")
	body := []byte(`{"grant_type":"refresh_token","refresh_token":"` + a.Placeholder + `"}`)
	out, used, err := v.FillBody("a1", "auth.example:443", "/oauth/token", body)
	require.NoError(t, err, "FillBody")
	assert.Len(t, used, 1, "FillBody: secrets used")
	assert.Equal(t, `{"grant_type":"refresh_token","refresh_token":"RT-1"}`, string(out), "FillBody")
	for _, tc := range []struct{ agent, host, path string }{{"a2", "auth.example", "/oauth/token"}, {"a1", "evil.example", "/oauth/token"}, {"a1", "auth.example", "/other"}} {
		out, used, _ := v.FillBody(tc.agent, tc.host, tc.path, body)
		assert.Empty(t, used, "FillBody(%+v) filled", tc)
		assert.Equal(t, string(body), string(out), "FillBody(%+v) filled", tc)
	}
	require.NoError(t, v.Replace("refresh", []byte("RT-2")))
	out, _, _ = v.FillBody("a1", "auth.example", "/oauth/token", body)
	assert.Contains(t, string(out), `"RT-2"`, "after Replace")
	got := v.Attachments("a1")
	if assert.Len(t, got, 1, "Replace changed the attachment") {
		assert.Equal(t, a.Placeholder, got[0].Placeholder, "Replace changed the attachment")
	}
	assert.Error(t, v.Replace("missing", []byte("x")), "replaced a missing secret")
}

func TestCovers(t *testing.T) {
	v, _ := newVault(t)
	v.Set(Secret{Name: "gh", Rule: Rule{Hosts: []string{"api.github.com", "*.githubusercontent.com"}, Header: "Authorization", Paths: []string{"/repos"}}}, []byte("t"))
	v.Attach("a1", "gh", "GH")
	for host, want := range map[string]bool{"api.github.com": true, "API.GitHub.com.": true, "raw.githubusercontent.com": true, "githubusercontent.com": false, "github.com": false, "": false} {
		assert.Equal(t, want, v.Covers("a1", host), "Covers(a1, %q)", host)
	}
	assert.False(t, v.Covers("a2", "api.github.com"), "an agent without the attachment is covered")
}

func TestAttachPlaceholderAndMemoryStorage(t *testing.T) {
	v, err := Open(&MemoryStorage{}, testKey(3), Config{})
	require.NoError(t, err)
	v.Set(Secret{Name: "k", Rule: Rule{Hosts: []string{"api.example"}, Header: "X-Key"}}, []byte("V"))
	v.Set(Secret{Name: "j", Rule: Rule{Hosts: []string{"api.example"}, Header: "X-Other"}}, []byte("W"))
	_, err = v.AttachPlaceholder("sb", "k", "KEY", "short")
	assert.Error(t, err, "a short placeholder was accepted")
	a, err := v.AttachPlaceholder("sb", "k", "KEY", "e2b-placeholder-0123456789abcdef")
	require.NoError(t, err)
	require.Equal(t, "e2b-placeholder-0123456789abcdef", a.Placeholder, "%+v", a)
	_, err = v.AttachPlaceholder("sb", "j", "J", "e2b-placeholder-0123456789abcdef")
	assert.Error(t, err, "a placeholder was given to two secrets")
	req := newRequest(t, "https://api.example/", http.Header{"Authorization": {"Bearer e2b-placeholder-0123456789abcdef"}})
	used, _ := v.Inject("sb", req)
	assert.Len(t, used, 1, "inject with a given placeholder: %v", req.Header)
	assert.Equal(t, "Bearer V", req.Header.Get("Authorization"), "inject with a given placeholder")
	assert.Equal(t, "V", req.Header.Get("X-Key"), "inject with a given placeholder")
}

// TestOpenRefusesAPlaceholderKey: a key that is all zero (the zero value
// of a buffer never filled) or of the wrong length opens no vault.
func TestOpenRefusesAPlaceholderKey(t *testing.T) {
	for _, key := range [][]byte{nil, make([]byte, KeySize), make([]byte, 16), testKey(1)[:KeySize-1], append(testKey(1), 1)} {
		_, err := Open(&MemoryStorage{}, key, Config{})
		assert.Error(t, err, "a key of %d bytes, %x", len(key), key)
	}
	key, err := NewKey()
	require.NoError(t, err)
	_, err = Open(&MemoryStorage{}, key, Config{})
	assert.NoError(t, err)
	other, err := NewKey()
	require.NoError(t, err)
	assert.NotEqual(t, key, other, "NewKey is random")
}

// TestAWSWithoutSignerRefused: a vault with no SigV4Signer refuses to
// send an AWSSigV4 secret's request rather than send it as signed.
func TestAWSWithoutSignerRefused(t *testing.T) {
	v, _ := newVault(t)
	require.NoError(t, v.Set(Secret{Name: "aws", Rule: Rule{Hosts: []string{"*.amazonaws.com"}, Mode: AWSSigV4}}, []byte("AKIAREAL:real-secret")))
	a, err := v.Attach("a1", "aws", "AWS_ACCESS_KEY_ID")
	require.NoError(t, err)
	now := time.Now().UTC()
	r := newRequest(t, "https://s3.amazonaws.com/bucket", http.Header{
		"Authorization": {"AWS4-HMAC-SHA256 Credential=" + a.Placeholder + "/" + now.Format("20060102") + "/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=00"},
		"X-Amz-Date":    {now.Format(awsTimeFormat)},
	})
	_, err = v.Inject("a1", r)
	assert.ErrorIs(t, err, ErrNoSigV4Signer)
	assert.Contains(t, r.Header.Get("Authorization"), a.Placeholder, "the request was changed")
}
