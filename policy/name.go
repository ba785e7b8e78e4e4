package policy

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/agenthold/egress/netguard"
)

// idnaProfile maps internationalised names to A-labels as a resolver would
// (UTS #46 lookup mapping, bidi rule), but keeps underscores, which appear
// in real service names.
var idnaProfile = idna.New(idna.MapForLookup(), idna.BidiRule(), idna.Transitional(false), idna.StrictDomainName(false))

// NormalizeName returns the canonical form of a DNS name, the only form
// policies compare: lower case, no trailing dot, internationalised labels
// as A-labels (punycode). Each label is 1 to 63 letters, digits, hyphens or
// underscores, not starting or ending with a hyphen; the whole is at most
// 253 bytes. Anything else is an error: a name that cannot be normalised
// is never allowed.
//
// A name that is already canonical is returned without allocating. An IP
// literal in any spelling is not a name (see netguard.ParseLiteral).
func NormalizeName(name string) (string, error) {
	// A name whose last label reads as a number is an address in
	// disguise, or nothing: no top-level domain is numeric.
	if _, err := netguard.ParseLiteral(name); !errors.Is(err, netguard.ErrNotLiteral) {
		return "", fmt.Errorf("policy: %q is an address, not a name", name)
	}
	if canonicalName(name, false) {
		return name, nil
	}
	n := strings.TrimSuffix(name, ".")
	if n == "" {
		return "", errors.New("policy: empty name")
	}
	if !isASCII(n) || hasALabel(n) {
		if !utf8.ValidString(n) {
			return "", fmt.Errorf("policy: name %q is not valid UTF-8", name)
		}
		a, err := idnaProfile.ToASCII(n)
		if err != nil {
			return "", fmt.Errorf("policy: invalid internationalised name %q: %v", name, err)
		}
		// The canonical form must be a fixed point: its A-labels decode
		// back to what they encode.
		if again, err := idnaProfile.ToASCII(a); err != nil || again != a {
			return "", fmt.Errorf("policy: internationalised name %q has no stable ASCII form", name)
		}
		n = a
	}
	n = strings.ToLower(n)
	if !canonicalName(n, true) {
		return "", fmt.Errorf("policy: invalid name %q", name)
	}
	return n, nil
}

// canonicalName reports whether s is a valid name already in canonical
// form. A-labels ("xn--") pass only with aLabels set, once IDNA has checked
// that they decode.
func canonicalName(s string, aLabels bool) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	label := 0 // length of the current label
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 || s[i-1] == '-' {
				return false
			}
			label = 0
			continue
		case c == '-':
			if label == 0 {
				return false
			}
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
		if label == 4 && !aLabels && s[i-3:i+1] == "xn--" {
			// An A-label must decode; take the slow path.
			return false
		}
	}
	return label > 0 && s[len(s)-1] != '-'
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func hasALabel(s string) bool {
	s = strings.ToLower(s)
	return strings.HasPrefix(s, "xn--") || strings.Contains(s, ".xn--")
}
