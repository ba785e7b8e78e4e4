package vault

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if err != nil || !bytes.Equal(got, plaintext) {
		t.Fatalf("open(vector) = %q, %v", got, err)
	}
	s1, err := seal(key, aad, plaintext)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := seal(key, aad, plaintext)
	if bytes.Equal(s1[:24], s2[:24]) {
		t.Fatal("two seals used the same nonce")
	}
	if got, err := open(key, aad, s1); err != nil || !bytes.Equal(got, plaintext) {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	for i := range sealed {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x01
		if _, err := open(key, aad, bad); !errors.Is(err, ErrOpen) {
			t.Fatalf("flipping byte %d: %v", i, err)
		}
	}
	if _, err := open(key, []byte("other record"), sealed); !errors.Is(err, ErrOpen) {
		t.Fatal("opened with other associated data")
	}
	if _, err := open(key, aad, sealed[:30]); !errors.Is(err, ErrOpen) {
		t.Fatal("opened a truncated record")
	}
}

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func newVault(t *testing.T) (*Vault, FileStorage) {
	t.Helper()
	st := FileStorage{Path: filepath.Join(t.TempDir(), "secrets.json")}
	v, err := Open(st, testKey(1), Config{PlaceholderPrefix: "agenthold"})
	if err != nil {
		t.Fatal(err)
	}
	return v, st
}

func preset(t *testing.T, name string) Rule {
	r, ok := Preset(name)
	if !ok {
		t.Fatalf("no preset %q", name)
	}
	return r
}

func TestPersistAndReopen(t *testing.T) {
	v, st := newVault(t)
	if err := v.Set(Secret{Name: "gh", Rule: preset(t, "github")}, []byte("ghp_secret1")); err != nil {
		t.Fatal(err)
	}
	a, err := v.Attach("a1", "gh", "GITHUB_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.Placeholder, "agenthold-placeholder-") || len(a.Placeholder) != len("agenthold-placeholder-")+32 {
		t.Fatalf("placeholder %q", a.Placeholder)
	}
	data, _ := os.ReadFile(st.Path)
	if bytes.Contains(data, []byte("ghp_secret1")) {
		t.Fatal("the value is in the file in clear")
	}
	v2, err := Open(st, testKey(1), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := v2.Attachments("a1"); len(got) != 1 || got[0] != a {
		t.Fatalf("attachments after reopen: %+v", got)
	}
	if l := v2.List(); len(l) != 1 || l[0].Name != "gh" || l[0].Rule.Header != "Authorization" {
		t.Fatalf("list: %+v", l)
	}
	// Attaching again keeps the placeholder.
	again, _ := v2.Attach("a1", "gh", "GH_TOKEN")
	if again.Placeholder != a.Placeholder || again.Env != "GH_TOKEN" {
		t.Fatalf("re-attach: %+v", again)
	}
	other, _ := v2.Attach("a2", "gh", "GITHUB_TOKEN")
	if other.Placeholder == a.Placeholder {
		t.Fatal("two attachments share a placeholder")
	}
}

func TestWrongKeyAndTampering(t *testing.T) {
	v, st := newVault(t)
	for _, n := range []string{"one", "two"} {
		if err := v.Set(Secret{Name: n, Rule: preset(t, "openai")}, []byte("sk-"+n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Attach("a1", "one", "OPENAI_API_KEY"); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(st.Path)
	if _, err := Open(st, testKey(2), Config{}); !errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), "wrong master key") || !strings.Contains(err.Error(), st.Path) {
		t.Fatalf("wrong key: %v", err)
	}
	// Every single-byte change of the file is refused.
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x20
		if err := os.WriteFile(st.Path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(st, testKey(1), Config{}); err == nil {
			t.Fatalf("a file changed at byte %d (%q) opened", i, good[i])
		}
	}
	// Truncations too.
	for _, n := range []int{0, 1, len(good) / 2, len(good) - 2, len(good) - 1} {
		os.WriteFile(st.Path, good[:n], 0o600)
		if _, err := Open(st, testKey(1), Config{}); err == nil {
			t.Fatalf("a file truncated to %d bytes opened", n)
		}
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
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
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
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(st.Path, out, 0o600)
			_, err = Open(st, testKey(1), Config{})
			if !errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), "record \"") {
				t.Fatalf("Open = %v, want ErrOpen naming the record", err)
			}
		})
	}
}

func TestRotate(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "one", Rule: preset(t, "anthropic")}, []byte("sk-ant-1"))
	if err := v.Rotate(testKey(9)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(st, testKey(1), Config{}); err == nil {
		t.Fatal("the old key still opens the vault")
	}
	v2, err := Open(st, testKey(9), Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := v2.Attach("a1", "one", "ANTHROPIC_API_KEY")
	req := newRequest(t, "https://api.anthropic.com/v1/messages", nil)
	if used, err := v2.Inject("a1", req); err != nil || len(used) != 1 || req.Header.Get("x-api-key") != "sk-ant-1" {
		t.Fatalf("inject after rotation: %v %v %q (%s)", used, err, req.Header.Get("x-api-key"), a.Placeholder)
	}
	if err := v2.Rotate([]byte("short")); err == nil {
		t.Fatal("rotated to a short key")
	}
}

func TestCrashLeftovers(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "one", Rule: preset(t, "openai")}, []byte("sk-1"))
	leftover := st.Path + ".tmp-deadbeef"
	if err := os.WriteFile(leftover, []byte(`{"format":"egress-vault","vers`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(st, testKey(1), Config{}); err != nil {
		t.Fatalf("a partial temporary file broke loading: %v", err)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("the partial temporary file was not removed")
	}
}

func TestKeyFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "master.key")
	k1, err := LoadKeyFile(path)
	if err != nil || len(k1) != KeySize {
		t.Fatalf("create: %d bytes, %v", len(k1), err)
	}
	fi, _ := os.Stat(path)
	di, _ := os.Stat(dir)
	if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
		t.Fatalf("modes: file %v, dir %v", fi.Mode().Perm(), di.Mode().Perm())
	}
	k2, err := LoadKeyFile(path)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload: %v", err)
	}
	os.Chmod(path, 0o640)
	if _, err := LoadKeyFile(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable key file: %v", err)
	}
	os.Chmod(path, 0o600)
	os.WriteFile(path, []byte("short"), 0o600)
	if _, err := LoadKeyFile(path); err == nil {
		t.Fatal("short key file accepted")
	}
}

func TestParseKey(t *testing.T) {
	k := testKey(7)
	for _, s := range []string{hex.EncodeToString(k), "  " + hex.EncodeToString(k) + "\n", "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=", "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"} {
		if got, err := ParseKey(s); err != nil || !bytes.Equal(got, k) {
			t.Errorf("ParseKey(%q) = %x, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "abcd", hex.EncodeToString(k[:31]), "not a key at all!"} {
		if _, err := ParseKey(s); err == nil {
			t.Errorf("ParseKey(%q) accepted it", s)
		}
	}
	t.Setenv("EGRESS_TEST_KEY", hex.EncodeToString(k))
	if got, err := KeyFromEnv("EGRESS_TEST_KEY"); err != nil || !bytes.Equal(got, k) {
		t.Errorf("KeyFromEnv: %v", err)
	}
	if _, err := KeyFromEnv("EGRESS_TEST_KEY_UNSET"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unset variable: %v", err)
	}
	if _, err := Open(FileStorage{Path: "/nonexistent"}, k[:16], Config{}); err == nil {
		t.Error("Open accepted a short key")
	}
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
		if _, err := r.compile(); err == nil {
			t.Errorf("rule %d (%+v) accepted", i, r)
		}
	}
	for _, name := range PresetNames() {
		r, _ := Preset(name)
		if _, err := r.compile(); err != nil {
			t.Errorf("preset %s: %v", name, err)
		}
	}
	v, _ := newVault(t)
	if err := v.Set(Secret{Name: "x", Rule: preset(t, "openai")}, []byte("line\r\nInjected: yes")); err == nil {
		t.Error("a value that would split a header was stored")
	}
	if err := v.Set(Secret{Name: "../x", Rule: preset(t, "openai")}, []byte("v")); err == nil {
		t.Error("a bad name was stored")
	}
	if err := v.Set(Secret{Name: "x", Rule: preset(t, "openai")}, nil); err == nil {
		t.Error("an empty value was stored")
	}
}

func newRequest(t testing.TB, rawURL string, header http.Header) *http.Request {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	if header == nil {
		header = http.Header{}
	}
	return &http.Request{Method: "GET", URL: u, Host: u.Host, Header: header}
}

func TestInjection(t *testing.T) {
	v, _ := newVault(t)
	set := func(name string, r Rule, value string) {
		if err := v.Set(Secret{Name: name, Rule: r}, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range PresetNames() {
		set(name, preset(t, name), "VAL-"+name)
	}
	set("login", Rule{Hosts: []string{"chatgpt.com", "*.openai.com"}, Header: "Authorization", Mode: Login, Paths: []string{"/backend-api"}}, "LOGIN-TOKEN")
	set("wild", Rule{Hosts: []string{"*.example.com"}, Header: "X-Key"}, "WILD-VALUE")
	ph := map[string]string{}
	for _, name := range append(PresetNames(), "login", "wild") {
		a, err := v.Attach("a1", name, strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
		if err != nil {
			t.Fatal(err)
		}
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
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(used, ","); got != tt.used {
				t.Errorf("used %q, want %q", got, tt.used)
			}
			for _, c := range tt.checks {
				if got := req.Header.Get(c.header); got != c.want {
					t.Errorf("%s = %q, want %q", c.header, got, c.want)
				}
			}
			if tt.query != "" && req.URL.RawQuery != tt.query {
				t.Errorf("query = %q, want %q", req.URL.RawQuery, tt.query)
			}
			if n := len(req.Header.Values("Authorization")); n > 1 {
				t.Errorf("Authorization sent %d times", n)
			}
		})
	}
}

func TestDeleteAndDetach(t *testing.T) {
	v, _ := newVault(t)
	v.Set(Secret{Name: "gh", Rule: preset(t, "github")}, []byte("ghp_1"))
	a, _ := v.Attach("a1", "gh", "GITHUB_TOKEN")
	if err := v.Detach("a1", "gh"); err != nil {
		t.Fatal(err)
	}
	req := newRequest(t, "https://api.github.com/user", http.Header{"Authorization": {"Bearer " + a.Placeholder}})
	if used, _ := v.Inject("a1", req); len(used) != 0 || req.Header.Get("Authorization") != "Bearer "+a.Placeholder {
		t.Fatal("a detached placeholder was replaced")
	}
	v.Attach("a1", "gh", "GITHUB_TOKEN")
	if err := v.Delete("gh"); err != nil {
		t.Fatal(err)
	}
	if len(v.Attachments("a1")) != 0 || len(v.List()) != 0 {
		t.Fatal("delete left the secret or its attachments")
	}
	if err := v.Delete("gh"); err == nil {
		t.Fatal("deleted a missing secret")
	}
}

func TestSetRuleKeepsValue(t *testing.T) {
	v, st := newVault(t)
	v.Set(Secret{Name: "k", Rule: Rule{Hosts: []string{"a.example"}, Header: "X-Key"}}, []byte("V1"))
	v.Attach("a1", "k", "K")
	if err := v.SetRule("k", Rule{Hosts: []string{"b.example"}, Header: "X-Key", Template: "T {{.Value}}"}); err != nil {
		t.Fatal(err)
	}
	v2, err := Open(st, testKey(1), Config{})
	if err != nil {
		t.Fatal(err)
	}
	req := newRequest(t, "https://b.example/", nil)
	if used, _ := v2.Inject("a1", req); len(used) != 1 || req.Header.Get("X-Key") != "T V1" {
		t.Fatalf("after SetRule: %q", req.Header.Get("X-Key"))
	}
	req = newRequest(t, "https://a.example/", nil)
	if used, _ := v2.Inject("a1", req); len(used) != 0 {
		t.Fatal("the old host still gets the value")
	}
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
		if used, err := v.Inject("a1", req); err != nil || len(used) != 1 {
			b.Fatal(used, err)
		}
	}
}

func TestFillBodyPlaceholderReplace(t *testing.T) {
	v, _ := newVault(t)
	rule := Rule{Hosts: []string{"auth.example"}, Header: "Authorization", Mode: Refresh, Paths: []string{"/oauth/token"}}
	if err := v.Set(Secret{Name: "refresh", Rule: rule}, []byte("RT-1")); err != nil {
		t.Fatal(err)
	}
	a, _ := v.Attach("a1", "refresh", "REFRESH")
	if ph, ok := v.Placeholder("a1", "refresh"); !ok || ph != a.Placeholder {
		t.Fatalf("Placeholder = %q, %v", ph, ok)
	}
	if _, ok := v.Placeholder("a2", "refresh"); ok {
		t.Fatal("another agent has a placeholder")
	}
	body := []byte(`{"grant_type":"refresh_token","refresh_token":"` + a.Placeholder + `"}`)
	out, used, err := v.FillBody("a1", "auth.example:443", "/oauth/token", body)
	if err != nil || len(used) != 1 || string(out) != `{"grant_type":"refresh_token","refresh_token":"RT-1"}` {
		t.Fatalf("FillBody = %s %v %v", out, used, err)
	}
	for _, tc := range []struct{ agent, host, path string }{{"a2", "auth.example", "/oauth/token"}, {"a1", "evil.example", "/oauth/token"}, {"a1", "auth.example", "/other"}} {
		if out, used, _ := v.FillBody(tc.agent, tc.host, tc.path, body); len(used) != 0 || !bytes.Equal(out, body) {
			t.Errorf("FillBody(%+v) filled: %s", tc, out)
		}
	}
	if err := v.Replace("refresh", []byte("RT-2")); err != nil {
		t.Fatal(err)
	}
	out, _, _ = v.FillBody("a1", "auth.example", "/oauth/token", body)
	if !bytes.Contains(out, []byte(`"RT-2"`)) {
		t.Fatalf("after Replace: %s", out)
	}
	if got := v.Attachments("a1"); len(got) != 1 || got[0].Placeholder != a.Placeholder {
		t.Fatal("Replace changed the attachment")
	}
	if err := v.Replace("missing", []byte("x")); err == nil {
		t.Fatal("replaced a missing secret")
	}
}

func TestCovers(t *testing.T) {
	v, _ := newVault(t)
	v.Set(Secret{Name: "gh", Rule: Rule{Hosts: []string{"api.github.com", "*.githubusercontent.com"}, Header: "Authorization", Paths: []string{"/repos"}}}, []byte("t"))
	v.Attach("a1", "gh", "GH")
	for host, want := range map[string]bool{"api.github.com": true, "API.GitHub.com.": true, "raw.githubusercontent.com": true, "githubusercontent.com": false, "github.com": false, "": false} {
		if got := v.Covers("a1", host); got != want {
			t.Errorf("Covers(a1, %q) = %v, want %v", host, got, want)
		}
	}
	if v.Covers("a2", "api.github.com") {
		t.Error("an agent without the attachment is covered")
	}
}

func TestAttachPlaceholderAndMemoryStorage(t *testing.T) {
	v, err := Open(&MemoryStorage{}, testKey(3), Config{})
	if err != nil {
		t.Fatal(err)
	}
	v.Set(Secret{Name: "k", Rule: Rule{Hosts: []string{"api.example"}, Header: "X-Key"}}, []byte("V"))
	v.Set(Secret{Name: "j", Rule: Rule{Hosts: []string{"api.example"}, Header: "X-Other"}}, []byte("W"))
	if _, err := v.AttachPlaceholder("sb", "k", "KEY", "short"); err == nil {
		t.Fatal("a short placeholder was accepted")
	}
	a, err := v.AttachPlaceholder("sb", "k", "KEY", "e2b-placeholder-0123456789abcdef")
	if err != nil || a.Placeholder != "e2b-placeholder-0123456789abcdef" {
		t.Fatalf("%+v %v", a, err)
	}
	if _, err := v.AttachPlaceholder("sb", "j", "J", "e2b-placeholder-0123456789abcdef"); err == nil {
		t.Fatal("a placeholder was given to two secrets")
	}
	req := newRequest(t, "https://api.example/", http.Header{"Authorization": {"Bearer e2b-placeholder-0123456789abcdef"}})
	if used, _ := v.Inject("sb", req); len(used) != 1 || req.Header.Get("Authorization") != "Bearer V" || req.Header.Get("X-Key") != "V" {
		t.Fatalf("inject with a given placeholder: %v %v", used, req.Header)
	}
}
