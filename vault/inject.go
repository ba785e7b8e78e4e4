package vault

import (
	"net/http"
	"net/url"
	"strings"
)

// Inject puts the agent's secrets into a request about to leave the
// gateway, as their rules say, and returns the names of the secrets it
// used. Only the agent's own attachments are considered, and only those
// whose rule covers the request's host and path:
//
//   - Inject mode sets the rule's header from its template, and replaces
//     the attachment's placeholder with the value wherever it appears in
//     the request's headers and query string;
//   - Login mode replaces the placeholder only inside the rule's header,
//     and only if the client sent it; it never adds the header.
//
// A placeholder bound for a host its rule does not name, or belonging to
// another agent, is left as it is: the value never goes where the rule
// does not send it. A value that cannot be opened is an error and the
// request must not be sent.
func (v *Vault) Inject(agent string, r *http.Request) ([]string, error) {
	v.mu.RLock()
	key := v.key
	atts := v.attach[agent]
	entries := make([]*secretEntry, len(atts))
	for i, a := range atts {
		entries[i] = v.secrets[a.Secret]
	}
	v.mu.RUnlock()

	var used []string
	if len(atts) == 0 {
		return nil, nil
	}
	host, err := normalizeHost(hostOf(r))
	if err != nil {
		return nil, nil // no rule names an invalid host
	}
	path := r.URL.Path
	for i, a := range atts {
		e := entries[i]
		if e == nil || !e.rule.matches(host, path) {
			continue
		}
		if e.rule.Mode == Login && !headerHas(r.Header, e.rule.Header, a.Placeholder) {
			continue
		}
		value, err := open(key, e.ad, e.stored.Sealed)
		if err != nil {
			return used, err
		}
		applied, err := apply(r, e.rule, a.Placeholder, string(value))
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

// apply puts one secret into r.
func apply(r *http.Request, rule *compiledRule, placeholder, value string) (bool, error) {
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
	for name, vals := range r.Header {
		for i, val := range vals {
			if strings.Contains(val, placeholder) {
				r.Header[name][i] = strings.ReplaceAll(val, placeholder, value)
			}
		}
	}
	if strings.Contains(r.URL.RawQuery, placeholder) {
		r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, placeholder, url.QueryEscape(value))
	}
	r.Header.Set(rule.Header, rendered)
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
