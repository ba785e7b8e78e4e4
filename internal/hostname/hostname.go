// Package hostname is the one place where the module puts DNS names in
// canonical form and matches host patterns, so that a policy and a
// secret's rule always agree on what a host is. It imports only the
// standard library and golang.org/x, so that every building block may use
// it.
package hostname

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// profile maps internationalised names to A-labels as a resolver would
// (UTS #46 lookup mapping, bidi rule), but keeps underscores, which appear
// in real service names.
var profile = idna.New(idna.MapForLookup(), idna.BidiRule(), idna.Transitional(false), idna.StrictDomainName(false))

// Normalize returns the canonical form of a DNS name: lower case, no
// trailing dot, internationalised labels as A-labels (punycode). Each
// label is 1 to 63 letters, digits, hyphens or underscores, not starting
// or ending with a hyphen; the whole is at most 253 bytes. A name whose
// last label reads as a number (decimal, or 0x hexadecimal) is an IP
// address in one of its inet_aton spellings, or nothing, since no
// top-level domain is numeric: it is refused. Anything else that is not a
// valid name is refused too.
//
// A name that is already canonical is returned without allocating.
func Normalize(name string) (string, error) {
	if canonical(name, false) && !numericTLD(name) {
		return name, nil
	}
	n := strings.TrimSuffix(name, ".")
	if n == "" {
		return "", errors.New("empty name")
	}
	if !isASCII(n) || hasALabel(n) {
		if !utf8.ValidString(n) {
			return "", fmt.Errorf("name %q is not valid UTF-8", name)
		}
		a, err := profile.ToASCII(n)
		if err != nil {
			return "", fmt.Errorf("invalid internationalised name %q: %v", name, err)
		}
		// The canonical form must be a fixed point: its A-labels decode
		// back to what they encode.
		if again, err := profile.ToASCII(a); err != nil || again != a {
			return "", fmt.Errorf("internationalised name %q has no stable ASCII form", name)
		}
		n = a
	}
	n = strings.ToLower(n)
	if numericTLD(n) {
		return "", fmt.Errorf("%q is an address, not a name", name)
	}
	if !canonical(n, true) {
		return "", fmt.Errorf("invalid name %q", name)
	}
	return n, nil
}

// canonical reports whether s is a valid name already in canonical form.
// A-labels ("xn--") pass only with aLabels set, once IDNA has checked that
// they decode.
func canonical(s string, aLabels bool) bool {
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

// numericTLD reports whether the last label of s (a trailing dot
// ignored) is a decimal number or 0x followed by hexadecimal digits.
func numericTLD(s string) bool {
	s = strings.TrimSuffix(s, ".")
	last := s[strings.LastIndexByte(s, '.')+1:]
	if last == "" {
		return false
	}
	digits := "0123456789"
	if len(last) >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X') {
		last, digits = last[2:], "0123456789abcdefABCDEF"
	}
	for i := 0; i < len(last); i++ {
		if !strings.ContainsRune(digits, rune(last[i])) {
			return false
		}
	}
	return true
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

// Pattern is a host pattern: one exact name, or, for "*.example.com",
// every name under example.com but never example.com itself.
type Pattern struct {
	Name     string // canonical; for a wildcard, the name after "*."
	Wildcard bool
}

// ParsePattern parses "example.com" or "*.example.com". The name is
// normalised; a wildcard over an ICANN public suffix ("*.com", "*.co.uk")
// is refused, since it would match every domain under it.
func ParsePattern(s string) (Pattern, error) {
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		name, err := Normalize(rest)
		if err != nil {
			return Pattern{}, fmt.Errorf("invalid wildcard: %v", err)
		}
		if ps, icann := publicsuffix.PublicSuffix(name); icann && ps == name {
			return Pattern{}, fmt.Errorf("wildcard over the public suffix %q would match every domain under it", name)
		}
		return Pattern{Name: name, Wildcard: true}, nil
	}
	if strings.Contains(s, "*") {
		return Pattern{}, errors.New(`"*" may only be a leading "*." label`)
	}
	name, err := Normalize(s)
	if err != nil {
		return Pattern{}, err
	}
	return Pattern{Name: name}, nil
}

// Matches reports whether a canonical name matches the pattern.
func (p Pattern) Matches(name string) bool {
	if !p.Wildcard {
		return name == p.Name
	}
	return len(name) > len(p.Name)+1 && name[len(name)-len(p.Name)-1] == '.' && strings.HasSuffix(name, p.Name)
}

// Suffixes calls f with each proper suffix of a canonical name, longest
// first ("b.c" then "c" for "a.b.c"), until f returns false: the names a
// wildcard pattern would have to carry to match it.
func Suffixes(name string, f func(suffix string) bool) {
	for i := strings.IndexByte(name, '.'); i >= 0; {
		suffix := name[i+1:]
		if !f(suffix) {
			return
		}
		j := strings.IndexByte(suffix, '.')
		if j < 0 {
			return
		}
		i += 1 + j
	}
}

// Same reports whether two names as they come off the wire (a DNS
// answer's owner and targets) are one name: DNS compares names without
// regard to ASCII case (RFC 4343), and a trailing dot does not count.
// Names that enter the gateway are put in canonical form by Normalize
// instead; Same is for comparing a canonical name with what an upstream
// sent back.
func Same(a, b string) bool {
	return strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, ".")) // the one case-insensitive comparison of names
}
