package vault

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	pathpkg "path"
	"strings"
)

// Inject puts the agent's secrets into a request about to leave the
// gateway, as their rules say, and returns the names of the secrets it
// used. Only the agent's own attachments are considered, and only those
// whose rule covers the request's host and path:
//
//   - Inject mode sets the rule's header from its template, and replaces
//     the attachment's placeholder with the value where the rule's
//     ReplaceIn says (by default the request's headers and query string);
//   - Login mode replaces the placeholder only inside the rule's header,
//     and only if the client sent it; it never adds the header;
//   - Refresh mode never injects: a request that carries a refresh
//     token's placeholder in a header or the query, to a host its rule
//     names, is refused with a *RefusedError.
//
// A placeholder bound for a host its rule does not name, or belonging to
// another agent, is left as it is: the value never goes where the rule
// does not send it. A value that cannot be opened is an error and the
// request must not be sent.
func (v *Vault) Inject(agent string, r *http.Request) (used []string, err error) {
	defer func() {
		if err != nil && r.Body != nil {
			r.Body.Close() // it will not be sent: give back what reading it held
		}
	}()
	key, atts, entries := v.attachmentsOf(agent)
	if len(atts) == 0 {
		return nil, nil
	}
	host, err := normalizeHost(hostOf(r))
	if err != nil {
		return nil, nil // no rule names an invalid host
	}
	path := r.URL.Path
	for i, a := range atts {
		if e := entries[i]; e != nil && e.rule.Mode == Refresh && e.rule.coversHost(host) && carries(r, a.Placeholder) {
			return nil, &RefusedError{Reason: fmt.Sprintf("the placeholder of refresh token %q goes only in the body of a refresh grant the gateway answers", a.Secret)}
		}
	}
	for i, a := range atts {
		e := entries[i]
		if e == nil || e.rule.Mode == Refresh || !e.rule.matches(host, path) {
			continue
		}
		if e.rule.Mode == Login && !headerHas(r.Header, e.rule.Header, a.Placeholder) {
			continue
		}
		if e.rule.Mode == GitHubApp {
			if r.Method == http.MethodDelete && revokesAppToken(r.URL.Path) {
				// Revoking the token would leave every agent sharing it
				// with a dead one until it nears its expiry.
				return used, &RefusedError{Reason: "revoking a GitHub App installation token the gateway minted"}
			}
			tok, err := v.appToken(r.Context(), a.Secret, e, key, appTokenMargin)
			if err == nil {
				err = valueRedacted(r.Context(), e.rule, tok.token)
			}
			if err != nil {
				return used, err
			}
			r.Header.Set("Authorization", renderAppToken(host, tok.token))
			used = append(used, a.Secret)
			continue
		}
		value, _, err := v.valueOf(key, e)
		if err == nil {
			err = valueRedacted(r.Context(), e.rule, string(value))
		}
		if err != nil {
			clear(value)
			return used, err
		}
		var applied bool
		if e.rule.Mode == AWSSigV4 {
			applied, err = v.resignAWSWith(agent, r, a.Placeholder, string(value))
		} else {
			applied, err = v.apply(agent, r, e.rule, a.Placeholder, string(value))
		}
		clear(value)
		if err != nil {
			return used, err
		}
		if applied {
			used = append(used, a.Secret)
		}
	}
	return used, nil
}

// RefusedError is an injection refused for what the request carries, not
// a failure of the gateway: the request is answered 400 with the reason.
type RefusedError struct {
	Reason string
}

func (e *RefusedError) Error() string { return "vault: " + e.Reason }

// Refused marks the error as the request's fault, for callers that
// answer it (mitm) without importing vault.
func (e *RefusedError) Refused() bool { return true }

// carries reports whether a request's headers or query hold s.
func carries(r *http.Request, s string) bool {
	if strings.Contains(r.URL.RawQuery, s) {
		return true
	}
	for _, vals := range r.Header {
		for _, v := range vals {
			if strings.Contains(v, s) {
				return true
			}
		}
	}
	return false
}

// attachmentsOf returns, consistently, the key and the agent's
// attachments with their secrets (nil where a secret is gone).
func (v *Vault) attachmentsOf(agent string) ([]byte, []Attachment, []*secretEntry) {
	cur := v.cur.Load()
	atts := cur.attach[agent]
	entries := make([]*secretEntry, len(atts))
	for i, a := range atts {
		entries[i] = cur.secrets[a.Secret]
	}
	return cur.key, atts, entries
}

// apply puts one secret into r.
func (v *Vault) apply(agent string, r *http.Request, rule *compiledRule, placeholder, value string) (bool, error) {
	if rule.Mode == Login {
		vals := r.Header.Values(rule.Header)
		for i, val := range vals {
			vals[i] = strings.ReplaceAll(val, placeholder, value)
		}
		return true, nil
	}
	rendered, err := rule.render(value)
	if err != nil {
		return false, err
	}
	if rule.inHeaders {
		for name, vals := range r.Header {
			for i, val := range vals {
				if strings.Contains(val, placeholder) {
					r.Header[name][i] = strings.ReplaceAll(val, placeholder, value)
				}
			}
		}
	}
	if rule.inQuery && strings.Contains(r.URL.RawQuery, placeholder) {
		r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, placeholder, url.QueryEscape(value))
	}
	if rule.inPath && strings.Contains(r.URL.Path, placeholder) {
		replacePath(r.URL, placeholder, value)
	}
	if rule.inBody && rule.takesBody(r) {
		if err := v.replaceBody(agent, r, placeholder, value); err != nil {
			return false, err
		}
	}
	if rule.Header != "" {
		r.Header.Set(rule.Header, rendered)
	}
	return true, nil
}

// headerHas reports whether any value of header name contains s.
func headerHas(h http.Header, name, s string) bool {
	for _, v := range h.Values(name) {
		if strings.Contains(v, s) {
			return true
		}
	}
	return false
}

// FillBody replaces the agent's refresh-token placeholders (Refresh
// rules) in a request body bound for host and path, for the secrets whose
// rules name them, and returns the names it used. It is the gateway's own
// refresh grant (mitm's RefreshExchange), the only way a refresh token
// leaves the vault.
func (v *Vault) FillBody(agent, host, path string, body []byte) ([]byte, []string, error) {
	h, err := normalizeHost(host)
	if err != nil {
		return body, nil, nil
	}
	key, atts, entries := v.attachmentsOf(agent)
	var used []string
	for i, a := range atts {
		e := entries[i]
		if e == nil || e.rule.Mode != Refresh || !e.rule.matches(h, path) || !bytes.Contains(body, []byte(a.Placeholder)) {
			continue
		}
		value, _, err := v.valueOf(key, e)
		if err != nil {
			return body, used, err
		}
		body = bytes.ReplaceAll(body, []byte(a.Placeholder), value)
		clear(value)
		used = append(used, a.Secret)
	}
	return body, used, nil
}

// Placeholder returns the agent's placeholder for a secret.
func (v *Vault) Placeholder(agent, secret string) (string, bool) {
	for _, a := range v.cur.Load().attach[agent] {
		if a.Secret == secret {
			return a.Placeholder, true
		}
	}
	return "", false
}

// Replace stores a new value for an existing secret, keeping its rule and
// attachments (a rotated token). The rule is read and the value stored
// under one writer's turn, so a concurrent SetRule is never lost.
func (v *Vault) Replace(name string, value []byte) error {
	if len(value) == 0 {
		return errors.New("vault: empty value")
	}
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	cur := v.cur.Load()
	e := cur.secrets[name]
	if e == nil {
		return noSecret(name)
	}
	if e.src != nil {
		return fmt.Errorf("vault: secret %q takes its value from its source, not Replace", name)
	}
	if err := e.rule.checkValue(string(value)); err != nil {
		return fmt.Errorf("vault: secret %q: %w", name, err)
	}
	return v.setLocked(cur, Secret{Name: name, Owner: e.stored.Owner, Rule: e.stored.Rule}, e.rule, value, nil)
}

// Covers reports whether one of the agent's attachments has a rule that
// names host: whether the gateway must intercept the agent's TLS to host.
func (v *Vault) Covers(agent, host string) bool {
	h, err := normalizeHost(host)
	if err != nil {
		return false
	}
	cur := v.cur.Load()
	for _, a := range cur.attach[agent] {
		if e := cur.secrets[a.Secret]; e != nil && e.rule.coversHost(h) {
			return true
		}
	}
	return false
}

// revokesAppToken says whether a DELETE of path could revoke an
// installation token: the path, cleaned and in any case, ends in
// /installation/token (GitHub Enterprise Server's API is under /api/v3,
// and a server may take "//" or "x/.." for "/").
func revokesAppToken(path string) bool {
	p := strings.ToLower(pathpkg.Clean("/" + path)) // not a name: a path
	return p == "/installation/token" || strings.HasSuffix(p, "/installation/token")
}
