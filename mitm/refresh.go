package mitm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"

	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/internal/redact"
)

// TokenStore is what RefreshExchange needs of the vault (vault.Vault
// implements it): an agent's placeholders, filling a request body for a
// host the secret's rule names, and storing a rotated value.
type TokenStore interface {
	Placeholder(agent, secret string) (string, bool)
	FillBody(agent, host, path string, body []byte) ([]byte, []string, error)
	Replace(secret string, value []byte) error
}

// maxTokenBody bounds the token request and response bodies read.
const maxTokenBody = 64 << 10

// RefreshExchange answers an OAuth 2.0 refresh-token grant (RFC 6749,
// section 6) at the gateway, so that a rotating refresh token never
// leaves it. The sandbox holds placeholders only. When it posts
// grant_type=refresh_token with its refresh-token placeholder to the
// token endpoint, the gateway performs the grant itself with the real
// token, stores the rotated refresh token (and the new access token, if
// AccessSecret is set) in the vault, and answers the sandbox with the
// same response, its tokens replaced by the agent's placeholders.
type RefreshExchange struct {
	Host, Path    string // the token endpoint, such as auth.openai.com (a port may follow) and /oauth/token
	RefreshSecret string // the secret that holds the refresh token
	AccessSecret  string // if set, the secret that holds the access token
	Store         TokenStore
	// Client sends the grant upstream: Interceptor.Client, so that the
	// grant takes the same guarded, verified path. Required.
	Client *http.Client
}

// Hook returns the Hook that answers the grant. A POST to the endpoint
// whose body carries the refresh token's placeholder but is not a
// refresh-token grant is refused (400): the token goes nowhere else.
func (x *RefreshExchange) Hook() Hook {
	return func(w http.ResponseWriter, r *http.Request, agent string) bool {
		if r.Method != http.MethodPost || !sameHost(httpfwd.HostOnly(r.Host), httpfwd.HostOnly(x.Host)) || r.URL.Path != x.Path {
			return false
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxTokenBody+1))
		if err != nil || len(body) > maxTokenBody {
			http.Error(w, "egress: token request too large or unreadable", http.StatusBadRequest)
			return true
		}
		refreshPH, ok := x.Store.Placeholder(agent, x.RefreshSecret)
		if !ok || !bytes.Contains(body, []byte(refreshPH)) {
			// Not ours: send it on untouched.
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			return false
		}
		if !isRefreshGrant(r.Header.Get("Content-Type"), body) {
			http.Error(w, "egress: "+ReasonNotAGrant, http.StatusBadRequest)
			return true
		}
		x.exchange(w, r, agent, body, refreshPH)
		return true
	}
}

// ReasonNotAGrant refuses a request that carries a refresh token's
// placeholder anywhere but in a refresh-token grant.
const ReasonNotAGrant = "the refresh token's placeholder goes only in a grant_type=refresh_token request"

func isRefreshGrant(contentType string, body []byte) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch mt {
	case "application/json":
		var v struct {
			GrantType string `json:"grant_type"`
		}
		return json.Unmarshal(body, &v) == nil && v.GrantType == "refresh_token"
	default:
		v, err := url.ParseQuery(string(body))
		return err == nil && v.Get("grant_type") == "refresh_token"
	}
}

// exchange performs the grant upstream and answers the sandbox.
func (x *RefreshExchange) exchange(w http.ResponseWriter, r *http.Request, agent string, body []byte, refreshPH string) {
	filled, used, err := x.Store.FillBody(agent, x.Host, x.Path, body)
	sent, sentUsed, sentErr := x.Store.FillBody(agent, x.Host, x.Path, []byte(refreshPH))
	if err != nil || sentErr != nil || len(used) == 0 || len(sentUsed) == 0 || len(sent) == 0 {
		http.Error(w, "egress: the refresh token's secret must have a refresh rule that names this endpoint", http.StatusBadGateway)
		return
	}
	defer clear(filled) // once the request is long sent
	defer clear(sent)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "https://"+x.Host+x.Path, bytes.NewReader(filled))
	if err != nil {
		http.Error(w, "egress: token request", http.StatusBadGateway)
		return
	}
	for _, h := range []string{"Content-Type", "User-Agent"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	// The gateway reads the answer itself: it asks for JSON, whatever the
	// sandbox asked for, and uncompressed.
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Accept-Encoding", "identity")
	if x.Client == nil {
		http.Error(w, "egress: no client configured for the token exchange", http.StatusBadGateway)
		return
	}
	resp, err := x.Client.Do(req)
	if err != nil {
		http.Error(w, "egress: token endpoint unreachable", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenBody+1))
	if err != nil || len(out) > maxTokenBody {
		http.Error(w, "egress: token response too large or unreadable", http.StatusBadGateway)
		return
	}
	// Whatever the status, the tokens go back as placeholders: an answer
	// carries new ones, an error may echo the request.
	scrub := []redact.Pair{}
	scrub = append(scrub, redact.Forms(string(sent), refreshPH)...)
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		kept, err := x.keepTokens(agent, resp.Header.Get("Content-Type"), out, refreshPH)
		if err != nil {
			http.Error(w, "egress: "+err.Error(), http.StatusBadGateway)
			return
		}
		scrub = append(scrub, kept...)
	}
	out = []byte(redact.New(scrub).String(string(out)))
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// keepTokens stores the tokens of a successful grant, the rotated refresh
// token first (before any step that may fail, so that a token the server
// has already rotated is never lost), and returns the pairs that put the
// agent's placeholders in their place. The answer may be JSON or
// form-encoded, whatever its Content-Type says. An answer whose tokens
// cannot be read or kept is an error: passing it on would hand the
// sandbox the real ones.
func (x *RefreshExchange) keepTokens(agent, contentType string, body []byte, refreshPH string) ([]redact.Pair, error) {
	rt, at, ok := tokenFields(contentType, body)
	if !ok {
		return nil, fmt.Errorf("token response is neither JSON nor form-encoded")
	}
	var pairs []redact.Pair
	if rt != "" {
		if err := x.Store.Replace(x.RefreshSecret, []byte(rt)); err != nil {
			return nil, fmt.Errorf("cannot store the rotated refresh token")
		}
		pairs = append(pairs, redact.Forms(rt, refreshPH)...)
	}
	if at != "" && x.AccessSecret != "" {
		ph, ok := x.Store.Placeholder(agent, x.AccessSecret)
		if !ok {
			return nil, fmt.Errorf("the access-token secret is not attached to this agent")
		}
		if err := x.Store.Replace(x.AccessSecret, []byte(at)); err != nil {
			return nil, fmt.Errorf("cannot store the access token")
		}
		pairs = append(pairs, redact.Forms(at, ph)...)
	}
	return pairs, nil
}

// tokenFields reads refresh_token and access_token from a JSON or a
// form-encoded answer.
func tokenFields(contentType string, body []byte) (refresh, access string, ok bool) {
	var fields struct {
		RefreshToken string `json:"refresh_token"`
		AccessToken  string `json:"access_token"`
	}
	if json.Unmarshal(body, &fields) == nil {
		return fields.RefreshToken, fields.AccessToken, true
	}
	mt, _, _ := mime.ParseMediaType(contentType)
	if v, err := url.ParseQuery(string(bytes.TrimSpace(body))); err == nil && (mt == "application/x-www-form-urlencoded" || v.Has("access_token") || v.Has("refresh_token")) {
		return v.Get("refresh_token"), v.Get("access_token"), true
	}
	return "", "", false
}

// Client returns an http.Client that sends requests the way the
// interceptor does (netguard at dial time, verified TLS), for hooks that
// talk upstream themselves.
func (i *Interceptor) Client(allowPrivate bool) *http.Client {
	i.init()
	return &http.Client{Transport: i.transports.For(allowPrivate), CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// sameHost reports whether two hosts are one name in canonical form.
func sameHost(a, b string) bool {
	na, errA := hostname.Normalize(a)
	nb, errB := hostname.Normalize(b)
	return errA == nil && errB == nil && na == nb
}
