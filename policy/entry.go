package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/netguard"
)

// portRange is an inclusive range of ports.
type portRange struct{ lo, hi uint16 }

var (
	defaultPorts = []portRange{{80, 80}, {443, 443}}
	anyPort      = []portRange{{0, 65535}}
)

// rule is one compiled entry: the text as written and its ports, and
// the address when the entry is one address.
type rule struct {
	text  string
	ports []portRange
	addr  netip.Addr
	// requestsOnly marks a request entry's host: it allows the host for
	// the requests the entry matches, not in full.
	requestsOnly bool
}

// namesPort reports whether the rule names port by itself (not within a
// range or "*").
func (r *rule) namesPort(port uint16) bool {
	for _, pr := range r.ports {
		if pr.lo == port && pr.hi == port {
			return true
		}
	}
	return false
}

// coversAllPorts reports whether the rule names every port.
func (r *rule) coversAllPorts() bool {
	for _, pr := range r.ports {
		if pr.lo == 0 && pr.hi == 65535 {
			return true
		}
	}
	return false
}

func (r *rule) allowsPort(port uint16) bool {
	for _, pr := range r.ports {
		if pr.lo <= port && port <= pr.hi {
			return true
		}
	}
	return false
}

// entryKind says what an entry's host part matches.
type entryKind uint8

const (
	kindName     entryKind = iota + 1 // one exact name
	kindWildcard                      // every subdomain of a name, not the name
	kindAny                           // every public destination ("*")
	kindPrefix                        // every address in a prefix
)

// entry is a parsed allow entry.
type entry struct {
	kind   entryKind
	name   string       // kindName: the name; kindWildcard: the suffix after "*."
	prefix netip.Prefix // kindPrefix
	rule   rule
}

// EntryError says which allow entry is wrong and why.
type EntryError struct {
	Entry  string
	Reason string
}

func (e *EntryError) Error() string { return fmt.Sprintf("policy: entry %q: %s", e.Entry, e.Reason) }

var errURLEntry = errors.New("entries are host[:port] (github.com, *.npmjs.org:443), or for some requests [METHODS] host/path (GET api.github.com/repos/**), not URLs: drop the scheme and user")

// compileEntry parses one allow entry. The forms are:
//
//	github.com                 the name, ports 80 and 443
//	github.com:22              the name, port 22
//	registry.example.com:*     the name, any port
//	github.com:8000-8100       the name, a port range
//	*.npmjs.org                every subdomain of npmjs.org, not npmjs.org itself
//	203.0.113.7, 203.0.113.0/24:443, [2001:db8::/32]:443, 2001:db8::1
//	                           addresses and prefixes (bare IPv6 takes no port)
//	*                          every public destination, any port
//	*:443                      every public destination, port 443
//
// Without a port, names and addresses mean ports 80 and 443. Names are
// normalised as by NormalizeName. A wildcard must have at least one label
// under a name that is not a public suffix ("*.com" and "*.co.uk" are
// refused; "*.github.io" is allowed).
func compileEntry(s string) (entry, error) {
	text := strings.TrimSpace(s)
	e, err := parseEntryText(text)
	if err != nil {
		return entry{}, &EntryError{Entry: s, Reason: err.Error()}
	}
	e.rule.text = text
	return e, nil
}

func parseEntryText(s string) (entry, error) {
	if s == "" {
		return entry{}, errors.New("empty entry")
	}
	if looksLikeURL(s) {
		return entry{}, errURLEntry
	}
	host, portText, err := splitEntry(s)
	if err != nil {
		return entry{}, err
	}
	ports, err := parsePorts(portText)
	if err != nil {
		return entry{}, err
	}
	switch {
	case host == "*":
		if portText == "" {
			ports = anyPort
		}
		return entry{kind: kindAny, rule: rule{ports: ports}}, nil
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return entry{}, fmt.Errorf("invalid address prefix: %v", err)
		}
		if p.Masked() != p {
			return entry{}, fmt.Errorf("prefix has bits set after /%d (did you mean %s?)", p.Bits(), p.Masked())
		}
		return entry{kind: kindPrefix, prefix: p, rule: rule{ports: ports}}, nil
	case strings.HasPrefix(host, "*."):
		pat, err := hostname.ParsePattern(host)
		if err != nil {
			return entry{}, err
		}
		return entry{kind: kindWildcard, name: pat.Name, rule: rule{ports: ports}}, nil
	case strings.Contains(host, "*"):
		return entry{}, errors.New(`"*" may only be the whole host or a leading "*." label`)
	}
	if a, err := netguard.ParseLiteral(host); err == nil {
		a = a.WithZone("").Unmap()
		return entry{kind: kindPrefix, prefix: netip.PrefixFrom(a, a.BitLen()), rule: rule{ports: ports, addr: a}}, nil
	} else if !errors.Is(err, netguard.ErrNotLiteral) {
		return entry{}, unprefixed(err)
	}
	name, err := NormalizeName(host)
	if err != nil {
		return entry{}, unprefixed(err)
	}
	return entry{kind: kindName, name: name, rule: rule{ports: ports}}, nil
}

// compileDenyEntry parses a deny entry (written without its "!"): the
// forms of an allow entry, every port when none is given; "*" is not one
// (a policy that denies everything is mode deny).
func compileDenyEntry(s string) (entry, error) {
	e, err := compileEntry(s)
	if err != nil {
		return entry{}, &EntryError{Entry: "!" + s, Reason: err.(*EntryError).Reason}
	}
	if e.kind == kindAny {
		return entry{}, &EntryError{Entry: "!" + s, Reason: `a deny entry cannot be "*": use mode deny`}
	}
	if _, port, _ := splitEntry(strings.TrimSpace(s)); port == "" {
		e.rule.ports = anyPort
	}
	e.rule.text = "!" + e.rule.text // as a Decision's Rule names it
	return e, nil
}

// looksLikeURL reports whether an entry was written as a URL: a scheme,
// user information, or a path after a name (a prefix's "/" follows an
// address, never a name).
func looksLikeURL(s string) bool {
	if strings.Contains(s, "://") || strings.Contains(s, "@") {
		return true
	}
	host, _, hasSlash := strings.Cut(s, "/")
	if !hasSlash {
		return false
	}
	_, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err != nil
}

// splitEntry splits an entry into host and port text ("" when absent).
func splitEntry(s string) (host, port string, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", errors.New(`missing "]"`)
		}
		host, rest := s[1:end], s[end+1:]
		if !strings.Contains(host, ":") {
			return "", "", errors.New("brackets are only for IPv6")
		}
		switch {
		case rest == "":
			return host, "", nil
		case len(rest) > 1 && rest[0] == ':':
			return host, rest[1:], nil
		}
		return "", "", fmt.Errorf(`unexpected %q after "]"`, rest)
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, "", nil
	case 1:
		host, port, _ := strings.Cut(s, ":")
		if port == "" {
			return "", "", errors.New(`missing port after ":"`)
		}
		return host, port, nil
	}
	return s, "", nil // bare IPv6, no port
}

// parsePorts parses "" (ports 80 and 443), "*", "N" or "N-M".
func parsePorts(s string) ([]portRange, error) {
	if s == "" {
		return defaultPorts, nil
	}
	if s == "*" {
		return anyPort, nil
	}
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, err := parsePort(lo)
	if err != nil {
		return nil, err
	}
	h, err := parsePort(hi)
	if err != nil {
		return nil, err
	}
	if l > h {
		return nil, fmt.Errorf("empty port range %d-%d", l, h)
	}
	return []portRange{{l, h}}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s[0] == '+' {
		return 0, fmt.Errorf("port %q is not in 1-65535", s)
	}
	return uint16(n), nil
}

// unprefixed drops a package prefix from an error's text, for errors
// nested inside an EntryError.
func unprefixed(err error) error {
	msg := err.Error()
	for _, p := range []string{"policy: ", "netguard: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return errors.New(msg)
}
