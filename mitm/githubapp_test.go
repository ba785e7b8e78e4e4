package mitm

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/vault"
)

// TestGitHubAppThroughInterception: the agent holds a placeholder; the
// gateway mints an installation token with the App's key (through its own
// guarded, verified upstream client, from a token endpoint that verifies
// the JWT), caches it, and injects it into API and git requests. Neither
// the key nor the token reaches the sandbox or a record, though the API
// echoes what it was sent.
func TestGitHubAppThroughInterception(t *testing.T) {
	r := newRig(t)
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	r.ic.Resolver.(testkit.Resolver)["api.github.com"] = loop
	r.ic.Resolver.(testkit.Resolver)["github.com"] = loop
	var err error
	r.pol, err = policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.github.com:*", "github.com:*"}})
	require.NoError(t, err)

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	pemKey := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	var minted atomic.Int32
	r.mux.HandleFunc("api.github.com/app/installations/77/access_tokens", func(w http.ResponseWriter, req *http.Request) {
		jwt, _ := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		if err := testkit.VerifyAppJWT(jwt, &key.PublicKey, 4242, time.Now()); err != nil || req.Method != http.MethodPost {
			http.Error(w, `{"message":"bad JWT"}`, http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"token":"ghs_mintedtoken%04d","expires_at":%q}`, minted.Add(1), time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	})
	r.mux.HandleFunc("api.github.com/user", func(w http.ResponseWriter, req *http.Request) {
		fmt.Fprintf(w, `{"login":"app[bot]","you_sent":%q}`, req.Header.Get("Authorization"))
	})
	r.mux.HandleFunc("github.com/org/repo.git/info/refs", func(w http.ResponseWriter, req *http.Request) {
		user, pass, ok := req.BasicAuth()
		if !ok || user != "x-access-token" || !strings.HasPrefix(pass, "ghs_mintedtoken") {
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "refs for %s", pass)
	})

	value, err := json.Marshal(map[string]any{"app_id": 4242, "installation_id": 77, "private_key": pemKey, "api_url": fmt.Sprintf("https://api.github.com:%d", r.upPort)})
	require.NoError(t, err)
	rule, _ := vault.Preset("github-app")
	require.NoError(t, r.vault.Set(vault.Secret{Name: "app", Rule: rule}, value))
	att, err := r.vault.Attach("a1", "app", "GITHUB_TOKEN")
	require.NoError(t, err)
	r.vault.SetTokenClient(r.ic.Client(false))
	var logged syncBuffer // every operational log line, for the canary
	r.ic.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))

	api := r.client(r.serveIntercepted("api.github.com"), true)
	var bodies []string
	for range 3 {
		resp, body := r.get(api, "https://api.github.com/user", http.Header{"Authorization": {"token " + att.Placeholder}})
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		bodies = append(bodies, body)
	}
	assert.Contains(t, bodies[0], "Bearer "+att.Placeholder, "the echoed token is the placeholder to the sandbox")
	resp, refs := r.get(r.client(r.serveIntercepted("github.com"), false), "https://github.com/org/repo.git/info/refs?service=git-upload-pack", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, refs)
	assert.Contains(t, refs, "refs for "+att.Placeholder, "git got the token, and the sandbox sees its placeholder")
	assert.EqualValues(t, 1, minted.Load(), "one token for every request until it nears its expiry")

	recs := r.log.List(egresslog.Filter{Kind: egresslog.KindHTTP}, 0)
	require.Len(t, recs, 4)
	for _, rec := range recs {
		assert.Equal(t, "app", rec.Secret, "record %+v", rec)
	}
	// Canary: the token and the key appear nowhere the sandbox or a
	// reader of the records could see.
	keyBody := strings.Split(pemKey, "\n")[1]
	for _, secret := range []string{"ghs_mintedtoken0001", base64.StdEncoding.EncodeToString([]byte("x-access-token:ghs_mintedtoken0001")), keyBody} {
		for _, b := range append(bodies, refs) {
			assert.NotContains(t, b, secret)
		}
		for _, rec := range r.log.List(egresslog.Filter{}, 0) {
			assert.NotContains(t, string(rec.AppendJSON(nil)), secret)
		}
		assert.NotContains(t, logged.String(), secret, "a log line holds a credential")
	}
}

// syncBuffer is a buffer log handlers on many goroutines may write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
