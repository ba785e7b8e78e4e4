package vault

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
)

// tokenServer is GitHub's token endpoint for one App: it verifies the
// App's JWT with the App's public key and issues installation tokens.
type tokenServer struct {
	pub      *rsa.PublicKey
	appID    int64
	install  int64
	minted   atomic.Int32
	refuse   atomic.Bool
	lifetime time.Duration
	now      func() time.Time // the clock expiry times are told by
}

func (s *tokenServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	jwt, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if r.Method != http.MethodPost || r.URL.Path != fmt.Sprintf("/app/installations/%d/access_tokens", s.install) {
		http.NotFound(w, r)
		return
	}
	if err := testkit.VerifyAppJWT(jwt, s.pub, s.appID, time.Now()); err != nil || s.refuse.Load() {
		http.Error(w, `{"message":"A JSON web token could not be decoded"}`, http.StatusUnauthorized)
		return
	}
	n := s.minted.Add(1)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"token":"ghs_minted%04dinstallationtoken","expires_at":%q}`, n, s.now().Add(s.lifetime).UTC().Format(time.RFC3339))
}

// githubAppSecret is a new App key and the secret's value naming api.
func githubAppSecret(t testing.TB, api string) (*rsa.PrivateKey, string) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	value, err := json.Marshal(map[string]any{"app_id": 4242, "installation_id": 77, "private_key": string(pemKey), "api_url": api})
	require.NoError(t, err)
	return key, string(value)
}

func TestGitHubAppTokens(t *testing.T) {
	now := time.Now()
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	ts := &tokenServer{appID: 4242, install: 77, lifetime: time.Hour, now: func() time.Time { return *clock.Load() }}
	srv := httptest.NewTLSServer(ts)
	defer srv.Close()
	key, value := githubAppSecret(t, srv.URL)
	ts.pub = &key.PublicKey
	v, err := Open(&MemoryStorage{}, testKey(1), Config{PlaceholderPrefix: "agenthold", Now: func() time.Time { return *clock.Load() }})
	require.NoError(t, err)
	rule, _ := Preset("github-app")
	require.NoError(t, v.Set(Secret{Name: "app", Rule: rule}, []byte(value)))
	a, err := v.Attach("a1", "app", "GITHUB_TOKEN")
	require.NoError(t, err)

	_, err = v.Inject("a1", newRequest(t, "https://api.github.com/user", nil))
	require.Error(t, err, "minted without a client")

	v.SetTokenClient(srv.Client())
	api := newRequest(t, "https://api.github.com/user", http.Header{"Authorization": {"token " + a.Placeholder}})
	used, err := v.Inject("a1", api)
	require.NoError(t, err)
	assert.Equal(t, []string{"app"}, used)
	assert.Equal(t, "Bearer ghs_minted0001installationtoken", api.Header.Get("Authorization"), "the API gets a bearer token")
	git := newRequest(t, "https://github.com/org/repo.git/info/refs?service=git-upload-pack", nil)
	_, err = v.Inject("a1", git)
	require.NoError(t, err)
	assert.Equal(t, "Basic "+base64.StdEncoding.EncodeToString([]byte("x-access-token:ghs_minted0001installationtoken")), git.Header.Get("Authorization"), "git gets basic authentication")
	assert.EqualValues(t, 1, ts.minted.Load(), "the token was not cached")

	// Concurrent requests once it nears its expiry: one exchange.
	later := now.Add(56 * time.Minute)
	clock.Store(&later)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := v.Inject("a1", newRequest(t, "https://api.github.com/user", nil))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	assert.EqualValues(t, 2, ts.minted.Load(), "a token near its expiry was not minted again once")

	// The redactor knows the current token and the one before.
	red, err := v.Redactor("a1", "api.github.com")
	require.NoError(t, err)
	for _, tok := range []string{"ghs_minted0001installationtoken", "ghs_minted0002installationtoken"} {
		out := red.String(`{"token":"` + tok + `"}`)
		assert.NotContains(t, out, tok)
		assert.Contains(t, out, a.Placeholder)
	}
	gitRed, err := v.Redactor("a1", "github.com")
	require.NoError(t, err)
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:ghs_minted0002installationtoken"))
	assert.NotContains(t, gitRed.String("Authorization: Basic "+basic), basic)

	// Revoking the shared token is refused, at each path a server may
	// take for it (GitHub Enterprise Server's API is under /api/v3).
	for _, path := range []string{"/installation/token", "/installation/token/", "/api/v3/installation/token", "//installation/token", "/installation//token", "/Installation/Token", "/x/../installation/token"} {
		revoke := newRequest(t, "https://api.github.com"+path, nil)
		revoke.Method = http.MethodDelete
		_, err = v.Inject("a1", revoke)
		var refused *RefusedError
		assert.ErrorAs(t, err, &refused, "a revocation of the minted token went through at %s", path)
		assert.Empty(t, revoke.Header.Get("Authorization"), path)
	}

	// A secret set again (rotated, or deleted and made anew under the
	// same name by someone else) never inherits the old token.
	require.NoError(t, v.Replace("app", []byte(value)))
	fresh := newRequest(t, "https://api.github.com/user", nil)
	_, err = v.Inject("a1", fresh)
	require.NoError(t, err)
	assert.EqualValues(t, 3, ts.minted.Load(), "a replaced secret reused the old one's token")
	assert.Equal(t, "Bearer ghs_minted0003installationtoken", fresh.Header.Get("Authorization"))

	// A refused exchange fails the request; nothing goes out with a
	// stale or placeholder credential.
	ts.refuse.Store(true)
	expired := now.Add(3 * time.Hour)
	clock.Store(&expired)
	r := newRequest(t, "https://api.github.com/user", http.Header{"Authorization": {"token " + a.Placeholder}})
	_, err = v.Inject("a1", r)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "401")
	assert.NotContains(t, err.Error(), "BEGIN", "the error quotes the key")
}

func TestGitHubAppValue(t *testing.T) {
	v, _ := newVault(t)
	rule, _ := Preset("github-app")
	_, good := githubAppSecret(t, "")
	var parsed map[string]any
	require.NoError(t, json.Unmarshal([]byte(good), &parsed))
	bad := func(change func(map[string]any)) string {
		m := map[string]any{}
		for k, val := range parsed {
			m[k] = val
		}
		change(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	for name, value := range map[string]string{
		"not JSON":        "app_id=1",
		"no app id":       bad(func(m map[string]any) { delete(m, "app_id") }),
		"no installation": bad(func(m map[string]any) { m["installation_id"] = 0 }),
		"not a key": bad(func(m map[string]any) {
			m["private_key"] = "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"
		}),
		"plain http API":    bad(func(m map[string]any) { m["api_url"] = "http://api.github.com" }),
		"an unknown field":  bad(func(m map[string]any) { m["client_secret"] = "x" }),
		"a header template": "",
	} {
		r := rule
		if name == "a header template" {
			r.Template, value = "Bearer {{.Value}}", good
		}
		assert.Error(t, v.Set(Secret{Name: "app", Rule: r}, []byte(value)), name)
	}
	assert.NoError(t, v.Set(Secret{Name: "app", Rule: rule}, []byte(good)))
}

// BenchmarkGitHubAppInject measures injecting a cached installation
// token.
func BenchmarkGitHubAppInject(b *testing.B) {
	ts := &tokenServer{appID: 4242, install: 77, lifetime: time.Hour, now: time.Now}
	srv := httptest.NewTLSServer(ts)
	defer srv.Close()
	key, value := githubAppSecret(b, srv.URL)
	ts.pub = &key.PublicKey
	v, err := Open(&MemoryStorage{}, testKey(1), Config{})
	require.NoError(b, err)
	v.SetTokenClient(srv.Client())
	rule, _ := Preset("github-app")
	require.NoError(b, v.Set(Secret{Name: "app", Rule: rule}, []byte(value)))
	_, err = v.Attach("a1", "app", "GITHUB_TOKEN")
	require.NoError(b, err)
	r := newRequest(b, "https://api.github.com/user", http.Header{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Inject("a1", r); err != nil {
			b.Fatal(err)
		}
	}
}

type ctxProbeKey struct{}

// probeTransport notes what the mint's request context held.
type probeTransport struct {
	next      http.RoundTripper
	value     atomic.Value
	cancelled atomic.Bool
}

func (p *probeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if v := r.Context().Value(ctxProbeKey{}); v != nil {
		p.value.Store(v)
	}
	p.cancelled.Store(r.Context().Err() != nil)
	return p.next.RoundTrip(r)
}

// TestGitHubAppMintCarriesTheRequestsContext: the token exchange made
// for a request carries that request's context values (a trace, say),
// and not its cancellation: other requests may be waiting for the token.
func TestGitHubAppMintCarriesTheRequestsContext(t *testing.T) {
	ts := &tokenServer{appID: 4242, install: 77, lifetime: time.Hour, now: time.Now}
	srv := httptest.NewTLSServer(ts)
	defer srv.Close()
	key, value := githubAppSecret(t, srv.URL)
	ts.pub = &key.PublicKey
	v, err := Open(&MemoryStorage{}, testKey(1), Config{PlaceholderPrefix: "agenthold"})
	require.NoError(t, err)
	rule, _ := Preset("github-app")
	require.NoError(t, v.Set(Secret{Name: "app", Rule: rule}, []byte(value)))
	_, err = v.Attach("a1", "app", "GITHUB_TOKEN")
	require.NoError(t, err)
	probe := &probeTransport{next: srv.Client().Transport}
	v.SetTokenClient(&http.Client{Transport: probe})

	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxProbeKey{}, "trace-1"))
	cancel() // the client went away; the mint goes on
	req := newRequest(t, "https://api.github.com/user", nil).WithContext(ctx)
	_, err = v.Inject("a1", req)
	require.NoError(t, err)
	assert.Equal(t, "trace-1", probe.value.Load(), "the mint lost the request's context")
	assert.False(t, probe.cancelled.Load(), "the mint was cancelled with one request")
	assert.EqualValues(t, 1, ts.minted.Load())
}
