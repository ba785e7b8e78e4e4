package mitm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/agenthold/egress/internal/httpfwd"
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

// Hook returns the Hook that answers the grant.
func (x *RefreshExchange) Hook() Hook {
	return func(w http.ResponseWriter, r *http.Request, agent string) bool {
		if r.Method != http.MethodPost || !strings.EqualFold(httpfwd.HostOnly(r.Host), httpfwd.HostOnly(x.Host)) || r.URL.Path != x.Path {
			return false
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxTokenBody+1))
		if err != nil || len(body) > maxTokenBody {
			http.Error(w, "egress: token request too large or unreadable", http.StatusBadRequest)
			return true
		}
		refreshPH, ok := x.Store.Placeholder(agent, x.RefreshSecret)
		if !ok || !bytes.Contains(body, []byte(refreshPH)) || !isRefreshGrant(r.Header.Get("Content-Type"), body) {
			// Not a grant with our placeholder: send it on untouched.
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			return false
		}
		x.exchange(w, r, agent, body, refreshPH)
		return true
	}
}

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
		http.Error(w, "egress: the refresh token's rule does not name this endpoint", http.StatusBadGateway)
		return
	}
	defer clear(filled) // once the request is long sent
	defer clear(sent)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "https://"+x.Host+x.Path, bytes.NewReader(filled))
	if err != nil {
		http.Error(w, "egress: token request", http.StatusBadGateway)
		return
	}
	for _, h := range []string{"Content-Type", "Accept", "User-Agent"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
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
	if resp.StatusCode == http.StatusOK {
		if out, err = x.keepTokens(agent, out, refreshPH); err != nil {
			http.Error(w, "egress: "+err.Error(), http.StatusBadGateway)
			return
		}
	}
	// Whatever the status, the token the grant sent goes back as the
	// placeholder: an error may echo the request.
	out = bytes.ReplaceAll(out, sent, []byte(refreshPH))
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// keepTokens stores the tokens of a successful grant and returns the
// response with placeholders in their place. A response whose refresh
// token cannot be kept is an error: passing it on would hand the sandbox
// the real token.
func (x *RefreshExchange) keepTokens(agent string, body []byte, refreshPH string) ([]byte, error) {
	var fields map[string]any
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, fmt.Errorf("token response is not JSON")
	}
	if rt, ok := fields["refresh_token"].(string); ok && rt != "" {
		if err := x.Store.Replace(x.RefreshSecret, []byte(rt)); err != nil {
			return nil, fmt.Errorf("cannot store the rotated refresh token")
		}
		fields["refresh_token"] = refreshPH
	}
	if at, ok := fields["access_token"].(string); ok && at != "" && x.AccessSecret != "" {
		ph, ok := x.Store.Placeholder(agent, x.AccessSecret)
		if !ok {
			return nil, fmt.Errorf("the access-token secret is not attached to this agent")
		}
		if err := x.Store.Replace(x.AccessSecret, []byte(at)); err != nil {
			return nil, fmt.Errorf("cannot store the access token")
		}
		fields["access_token"] = ph
	}
	return json.Marshal(fields)
}

// Client returns an http.Client that sends requests the way the
// interceptor does (netguard at dial time, verified TLS), for hooks that
// talk upstream themselves.
func (i *Interceptor) Client(allowPrivate bool) *http.Client {
	i.init()
	return &http.Client{Transport: i.transports.For(allowPrivate), CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
