package redact

import "context"

// Covers reports whether s is the Find of one of r's pairs: whether r
// redacts s itself (and, with Forms, its encodings).
func (r *Replacer) Covers(s string) bool {
	if r == nil || s == "" {
		return false
	}
	for _, p := range r.pairs {
		if p.Find == s {
			return true
		}
	}
	return false
}

// CoversReplacements reports whether r redacts every Replace of sub: a
// substitution (a placeholder replaced by a value on the way out) whose
// values come back redacted.
func (r *Replacer) CoversReplacements(sub *Replacer) bool {
	if sub == nil {
		return true
	}
	for _, p := range sub.pairs {
		if !r.Covers(p.Replace) {
			return false
		}
	}
	return true
}

type replacerKey struct{}

// WithReplacer returns ctx carrying the replacer that will redact the
// answer to a request made with it, so that what is put into the request
// can be checked against it (a secret whose value changed meanwhile).
func WithReplacer(ctx context.Context, r *Replacer) context.Context {
	return context.WithValue(ctx, replacerKey{}, r)
}

// ReplacerFrom returns the replacer WithReplacer put in ctx, or nil.
func ReplacerFrom(ctx context.Context) *Replacer {
	r, _ := ctx.Value(replacerKey{}).(*Replacer)
	return r
}
