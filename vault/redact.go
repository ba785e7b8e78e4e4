package vault

import (
	"context"
	"fmt"
	"strings"

	"github.com/agenthold/egress/internal/redact"
)

// Redactor returns the replacer that puts an agent's placeholders back
// wherever a response from host echoes the value of one of the agent's
// secrets whose rule names host (injected into the request or not): in
// each form redact.Forms lists, and in the rule's own rendering ("Bearer
// …", "Basic base64(…)") and its token. It returns nil when no rule of
// the agent names host. A value that cannot be opened is an error: the
// exchange must not go on without its redaction.
func (v *Vault) Redactor(agent, host string) (*redact.Replacer, error) {
	h, err := normalizeHost(host)
	if err != nil {
		return nil, nil // no rule names an invalid host
	}
	cur := v.cur.Load()
	// The cache keeps one redactor per agent, host and covering secrets
	// (app tokens render per host), replaced when what it was made for
	// changes: a source's value, an app token.
	var key, version strings.Builder
	var covering []Attachment
	tokens := map[string]appToken{}
	sourced := map[string][]byte{} // the values of secrets with a source, read once
	for _, a := range cur.attach[agent] {
		e := cur.secrets[a.Secret]
		if e == nil || !e.rule.coversHost(h) {
			continue
		}
		if key.Len() == 0 {
			key.WriteString(agent)
			key.WriteByte(0)
			key.WriteString(h)
		}
		key.WriteByte(0)
		key.WriteString(a.Secret)
		covering = append(covering, a)
		if e.src != nil {
			value, gen, err := v.valueOf(cur.key, e)
			if err != nil {
				return nil, err
			}
			defer clear(value)
			sourced[a.Secret] = value
			fmt.Fprintf(&version, "%s=%d\x00", a.Secret, gen)
		}
		if e.rule.Mode == GitHubApp {
			// The token the request will carry, minted now if need be:
			// the redactor must know it before the response comes.
			tok, err := v.appToken(context.Background(), a.Secret, e, cur.key, appTokenMargin+appTokenLead) // Redactor has no request
			if err != nil {
				return nil, err
			}
			tokens[a.Secret] = tok
			fmt.Fprintf(&version, "%s=%s\x00", a.Secret, tok.token)
		}
	}
	if len(covering) == 0 {
		return nil, nil
	}
	if c, ok := cur.redactors.Load(key.String()); ok && c.(cachedRedactor).version == version.String() {
		return c.(cachedRedactor).r, nil
	}
	var pairs []redact.Pair
	for _, a := range covering {
		e := cur.secrets[a.Secret]
		value, ok := sourced[a.Secret]
		if !ok {
			var err error
			if value, err = open(cur.key, e.ad, e.stored.Sealed); err != nil {
				return nil, fmt.Errorf("vault: secret %q: %w", a.Secret, err)
			}
			defer clear(value)
		}
		pairs = append(pairs, valueForms(e.rule, string(value), a.Placeholder)...)
		if tok, ok := tokens[a.Secret]; ok {
			pairs = append(pairs, appTokenForms(h, tok, a.Placeholder)...)
		}
	}
	r := redact.New(pairs)
	cur.redactors.Store(key.String(), cachedRedactor{version: version.String(), r: r})
	return r, nil
}

// cachedRedactor is a redactor and what it was made for.
type cachedRedactor struct {
	version string
	r       *redact.Replacer
}

// valueForms are the pairs that replace a value with its placeholder: the
// value's forms, and those of the rule's rendering of it.
func valueForms(rule *compiledRule, value, placeholder string) []redact.Pair {
	if rule.Mode == AWSSigV4 {
		// Each credential alone: an error may quote the key ID.
		var pairs []redact.Pair
		if creds, err := parseAWSValue(value); err == nil {
			for _, part := range []string{creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken} {
				if part != "" {
					pairs = append(pairs, redact.Forms(part, placeholder)...)
				}
			}
		}
		return pairs
	}
	pairs := redact.Forms(value, placeholder)
	if rule.Mode != Inject {
		return pairs // only inject rules render the value
	}
	rv, err1 := rule.render(value)
	rp, err2 := rule.render(placeholder)
	if err1 != nil || err2 != nil || rv == value {
		return pairs
	}
	pairs = append(pairs, redact.Forms(rv, rp)...)
	// The credential of "Scheme credential", alone.
	if i, j := strings.IndexByte(rv, ' '), strings.IndexByte(rp, ' '); i > 0 && j > 0 && rv[:i] == rp[:j] {
		pairs = append(pairs, redact.Forms(rv[i+1:], rp[j+1:])...)
	}
	return pairs
}

// appTokenForms are the pairs that replace a GitHub App's installation
// tokens (the current one and the one before) with the placeholder:
// alone, and as the Authorization the host takes.
func appTokenForms(host string, tok appToken, placeholder string) []redact.Pair {
	var pairs []redact.Pair
	for _, t := range []string{tok.token, tok.prev} {
		if t != "" {
			pairs = append(pairs, redact.Forms(t, placeholder)...)
			pairs = append(pairs, redact.Forms(renderAppToken(host, t), renderAppToken(host, placeholder))...)
		}
	}
	return pairs
}

// valueRedacted refuses a value about to be sent that the redactor of the
// request's answer (redact.WithReplacer on its context) does not redact:
// the value changed between the two (a source's file, a Replace, a
// refresh, a new app token), the redactor being made first, and the
// answer could echo it. Every value Inject sends passes here. A request
// without a redactor is not checked: nothing of its answer is redacted.
func valueRedacted(ctx context.Context, rule *compiledRule, value string) error {
	red := redact.ReplacerFrom(ctx)
	if red == nil {
		return nil
	}
	parts := []string{value}
	if rule.Mode == AWSSigV4 {
		if creds, err := parseAWSValue(value); err == nil {
			parts = []string{creds.AccessKeyID, creds.SecretAccessKey}
			if creds.SessionToken != "" {
				parts = append(parts, creds.SessionToken)
			}
		}
	}
	for _, part := range parts {
		if !red.Covers(part) {
			return &RefusedError{Reason: "a secret's value changed while the request was prepared; send it again"}
		}
	}
	return nil
}
