package vault

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
)

// A GitHubApp secret's value is a JSON object: the App's ID, the
// installation's, and the App's private key (PEM), and for GitHub
// Enterprise the API's base URL. The gateway mints installation tokens
// with it; the sandbox holds only the placeholder.
type githubApp struct {
	AppID          int64  `json:"app_id"`
	InstallationID int64  `json:"installation_id"`
	PrivateKey     string `json:"private_key"`
	APIURL         string `json:"api_url,omitempty"`
	key            *rsa.PrivateKey
}

// DefaultGitHubAPI is where installation tokens are minted unless a
// secret names another API.
const DefaultGitHubAPI = "https://api.github.com"

// Timing of installation tokens: minted for an hour by GitHub, used
// until appTokenMargin before they expire, and minted again by the
// redactor appTokenLead earlier still, so that a request is never
// injected with a token its response's redactor does not know.
const (
	appTokenMargin  = 5 * time.Minute
	appTokenLead    = time.Minute
	appMintTimeout  = 10 * time.Second
	maxTokenReplyKB = 64
)

func parseGitHubApp(value string) (*githubApp, error) {
	var app githubApp
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&app); err != nil {
		return nil, errors.New(`a github-app secret is {"app_id": N, "installation_id": N, "private_key": "PEM"[, "api_url": "https://..."]}`)
	}
	if app.AppID <= 0 || app.InstallationID <= 0 {
		return nil, errors.New("a github-app secret needs a positive app_id and installation_id")
	}
	block, _ := pem.Decode([]byte(app.PrivateKey))
	if block == nil {
		return nil, errors.New("a github-app secret's private_key is not PEM")
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		app.key = k
	} else if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		app.key, _ = k.(*rsa.PrivateKey)
	}
	if app.key == nil {
		return nil, errors.New("a github-app secret's private_key is not an RSA key")
	}
	if app.APIURL == "" {
		app.APIURL = DefaultGitHubAPI
	}
	if u, err := url.Parse(app.APIURL); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("a github-app secret's api_url must be an https URL")
	}
	return &app, nil
}

// jwt is the App's JSON Web Token (RS256), valid for nine minutes from a
// minute ago (GitHub allows ten, and clocks drift). Hand-written: it is
// one signature over two fixed JSON objects.
func (a *githubApp) jwt(now time.Time) (string, error) {
	enc := base64.RawURLEncoding
	claims := fmt.Sprintf(`{"iat":%d,"exp":%d,"iss":"%d"}`, now.Add(-time.Minute).Unix(), now.Add(9*time.Minute).Unix(), a.AppID)
	signing := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc.EncodeToString([]byte(claims))
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, a.key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return signing + "." + enc.EncodeToString(sig), nil
}

// appToken is an installation token, and the one before it (still
// redacted: a response to a request sent with it may yet arrive).
type appToken struct {
	token, prev string
	expires     time.Time
}

// appTokens caches installation tokens by secret; a mint holds the
// secret's lock, so concurrent requests wait for one exchange.
type appTokens struct {
	mu     sync.Mutex
	client *http.Client
	locks  map[appKey]*sync.Mutex
	tokens map[appKey]appToken
}

// SetTokenClient gives the vault the HTTP client that mints GitHub App
// installation tokens: the gateway's guarded, verified upstream client
// (mitm's Interceptor.Client). Without one, GitHub App secrets fail to
// inject.
func (v *Vault) SetTokenClient(c *http.Client) {
	v.apps.mu.Lock()
	defer v.apps.mu.Unlock()
	v.apps.client = c
}

// cached returns secret's token and the one before it, if the token is
// good for longer than within.
// appKey names a secret as sealed: its name and its sealing's nonce.
type appKey struct {
	name  string
	nonce [chacha20poly1305.NonceSizeX]byte
}

func (t *appTokens) cached(secret appKey, now time.Time, within time.Duration) (appToken, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.tokens[secret]
	return tok, ok && tok.expires.Sub(now) > within
}

// appToken returns an installation token for secret good for longer than
// within, minting one if the cached one is not. The mint carries ctx's
// values (not its cancellation: other requests may wait for the token).
//
// Tokens are cached by the secret's sealing, not its name: a secret set
// again, replaced or deleted and made anew under the same name (by
// another owner, with another App) is sealed under a fresh random nonce,
// and never inherits the old one's token.
func (v *Vault) appToken(ctx context.Context, name string, e *secretEntry, key []byte, within time.Duration) (appToken, error) {
	t := &v.apps
	now := v.now()
	secret := appKey{name: name, nonce: [chacha20poly1305.NonceSizeX]byte(e.stored.Sealed)}
	if tok, ok := t.cached(secret, now, within); ok {
		return tok, nil
	}
	t.mu.Lock()
	if t.locks == nil {
		t.locks, t.tokens = map[appKey]*sync.Mutex{}, map[appKey]appToken{}
	}
	l := t.locks[secret]
	if l == nil {
		l = new(sync.Mutex)
		t.locks[secret] = l
	}
	client := t.client
	t.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	if tok, ok := t.cached(secret, now, within); ok {
		return tok, nil // minted while this one waited
	}
	if client == nil {
		return appToken{}, errors.New("vault: no client to mint GitHub App tokens with (SetTokenClient)")
	}
	value, _, err := v.valueOf(key, e)
	if err != nil {
		return appToken{}, fmt.Errorf("vault: secret %q: %w", name, err)
	}
	app, err := parseGitHubApp(string(value))
	clear(value)
	if err != nil {
		return appToken{}, fmt.Errorf("vault: secret %q: %w", name, err)
	}
	minted, expires, err := app.mint(context.WithoutCancel(ctx), client)
	if err != nil {
		return appToken{}, fmt.Errorf("vault: secret %q: %w", name, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tok := appToken{token: minted, prev: t.tokens[secret].token, expires: expires}
	t.tokens[secret] = tok
	return tok, nil
}

// mint exchanges the App's JWT, dated by the system clock (GitHub's
// reference), for an installation token.
func (a *githubApp) mint(ctx context.Context, client *http.Client) (string, time.Time, error) {
	now := time.Now()
	jwt, err := a.jwt(now)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("signing the GitHub App JWT: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, appMintTimeout)
	defer cancel()
	endpoint := strings.TrimSuffix(a.APIURL, "/") + "/app/installations/" + strconv.FormatInt(a.InstallationID, 10) + "/access_tokens"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, nil)
	if err != nil {
		return "", time.Time{}, err
	}
	req.Header.Set("Authorization", "Bearer "+jwt)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	resp, err := client.Do(req)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("minting a GitHub App token: %w", err)
	}
	defer resp.Body.Close()
	var reply struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if resp.StatusCode != http.StatusCreated {
		return "", time.Time{}, fmt.Errorf("minting a GitHub App token: %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenReplyKB<<10)).Decode(&reply); err != nil || reply.Token == "" {
		return "", time.Time{}, errors.New("minting a GitHub App token: the reply holds no token")
	}
	if reply.ExpiresAt.IsZero() {
		reply.ExpiresAt = now.Add(time.Hour)
	}
	return reply.Token, reply.ExpiresAt, nil
}

// renderAppToken is the Authorization a GitHub host takes: a bearer
// token for the API, basic authentication as x-access-token for git.
func renderAppToken(host, token string) string {
	if strings.HasPrefix(host, "api.") {
		return "Bearer " + token
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+token))
}
