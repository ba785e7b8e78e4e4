package netguard

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrNotLiteral is returned by [ParseLiteral] for a host that is a name, not
// an address.
var ErrNotLiteral = errors.New("netguard: not an IP literal")

// ParseLiteral recognises a host that is really an IP address, in every
// spelling that resolvers and socket libraries accept: dotted quads, the
// BSD inet_aton forms with fewer parts ("127.1", "2130706433"), octal and
// hexadecimal parts ("0177.0.0.1", "0x7f000001"), a trailing dot, IPv6
// with or without brackets and zone, and IPv4-mapped IPv6.
//
// It returns [ErrNotLiteral] for a host whose last label is not numeric,
// which is a name to resolve. A host that looks numeric but is not a valid
// address ("1.2.3.256", "08.1") returns another error: it is neither an
// address nor a valid name, and callers must refuse it.
func ParseLiteral(host string) (netip.Addr, error) {
	h := host
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() {
			return netip.Addr{}, fmt.Errorf("netguard: invalid bracketed address %q", host)
		}
		return a, nil
	}
	if strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("netguard: invalid IPv6 address %q", host)
		}
		return a, nil
	}
	h = strings.TrimSuffix(h, ".")
	if !numericLabel(h[strings.LastIndexByte(h, '.')+1:]) {
		return netip.Addr{}, ErrNotLiteral
	}
	a, ok := parseInetAton(h)
	if !ok {
		return netip.Addr{}, fmt.Errorf("netguard: %q looks like an IPv4 address but is not a valid one", host)
	}
	return a, nil
}

// numericLabel reports whether a label could only be part of an address:
// it starts with a digit and holds only hexadecimal digits and x. Top-level
// domains are never numeric (RFC 1123 section 2.1, RFC 3696 section 2).
func numericLabel(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || c == 'x' || c == 'X') {
			return false
		}
	}
	return true
}

// parseInetAton parses IPv4 in the forms inet_aton(3) accepts: one to four
// parts, each decimal, octal (leading 0) or hexadecimal (leading 0x); the
// last part fills the remaining bytes.
func parseInetAton(s string) (netip.Addr, bool) {
	var v uint64
	for i := 0; ; i++ {
		part, rest, more := strings.Cut(s, ".")
		n, ok := parseAtonPart(part)
		if !ok || i > 3 {
			return netip.Addr{}, false
		}
		if more {
			if n > 0xff {
				return netip.Addr{}, false
			}
			v, s = v<<8|n, rest
			continue
		}
		fill := 4 - i // bytes the last part fills
		if n >= 1<<(8*fill) {
			return netip.Addr{}, false
		}
		v = v<<(8*fill) | n
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
	}
}

func parseAtonPart(p string) (uint64, bool) {
	base := 10
	switch {
	case p == "":
		return 0, false
	case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
		p, base = p[2:], 16
	case len(p) > 1 && p[0] == '0':
		p, base = p[1:], 8
	}
	n, err := strconv.ParseUint(p, base, 32)
	return n, err == nil
}
