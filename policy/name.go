package policy

import (
	"fmt"

	"github.com/agenthold/egress/internal/hostname"
)

// NormalizeName returns the canonical form of a DNS name, the only form
// policies compare: lower case, no trailing dot, internationalised labels
// as A-labels (punycode). Each label is 1 to 63 letters, digits, hyphens or
// underscores, not starting or ending with a hyphen; the whole is at most
// 253 bytes. Anything else is an error: a name that cannot be normalised
// is never allowed. Secret rules (vault) normalise names the same way.
//
// A name that is already canonical is returned without allocating. An IP
// literal in any spelling is not a name (see netguard.ParseLiteral).
func NormalizeName(name string) (string, error) {
	n, err := hostname.Normalize(name)
	if err != nil {
		return "", fmt.Errorf("policy: %w", err)
	}
	return n, nil
}
