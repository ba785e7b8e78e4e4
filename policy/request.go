package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/agenthold/egress/internal/hostname"
)

// Reasons of request decisions.
const (
	// ReasonRequestRules allows a connection to a host that request rules
	// name: each request on it is judged by DecideRequest.
	ReasonRequestRules = "allowed for the requests its request rules allow"
	// ReasonNoRequestRule refuses a request on such a host that no
	// request rule allows.
	ReasonNoRequestRule = "no request rule allows the method and path"
)

// A request entry is an allow or deny entry for some requests to a host:
//
//	GET,HEAD api.github.com/repos/acme/*     those methods, that path
//	POST api.openai.com/v1/chat/completions  one method, one path
//	github.com/acme/scratch.git/**           every method, everything under the path
//	!DELETE *.github.com/**                  a deny entry: no DELETE on any subdomain
//
// The method set is a comma-separated list before a space; none means
// every method. The host is a name or a "*." wildcard, with a port as in
// other entries (ports 80 and 443 when none is given for an allow entry,
// every port for a deny entry). The path pattern's segments are literal,
// "*" (exactly one segment) or "**" (any number, none included: at most
// two in a pattern); a trailing slash is ignored, as in paths.
type requestRule struct {
	text    string
	methods methodSet
	ports   []portRange
	mcp     *mcpRule // an MCP endpoint's: its messages are judged too
}

// pathNode is a trie of path patterns, one segment per level.
type pathNode struct {
	next  map[string]*pathNode // literal segments
	one   *pathNode            // "*"
	many  *pathNode            // "**"
	rules []*requestRule       // the patterns that end here
}

// requestRules are a name's request entries, or its subdomains'.
type requestRules struct {
	allow, deny pathNode
	mcp         pathNode // MCP endpoints, judged whatever else allows the host
	// judgedHosts are the deny entries and MCP endpoints as host rules:
	// the connections whose requests must be seen even when an entry
	// allows the host in full.
	judgedHosts []rule
}

// maxDoubleStars bounds "**" per pattern, which bounds the work a path
// can cause (MaxPathSegments to the power of it).
const maxDoubleStars = 2

// isRequestEntry reports whether an entry (without its "!") is a request
// entry: a method set before a space, or a path after a host name (a
// prefix's "/" follows an address).
func isRequestEntry(s string) bool {
	if strings.ContainsAny(s, " \t") {
		return true
	}
	if strings.Contains(s, "://") || strings.Contains(s, "@") {
		return false // a URL, which compileEntry explains
	}
	host, _, hasSlash := strings.Cut(s, "/")
	if !hasSlash || strings.HasPrefix(host, "[") {
		return false
	}
	_, err := netip.ParseAddr(host)
	return err != nil
}

// compiledRequest is a parsed request entry.
type compiledRequest struct {
	host     entry // its host part, kindName or kindWildcard, with its ports
	segments []string
	rule     *requestRule
}

// compileRequestEntry parses a request entry (text without its "!").
func compileRequestEntry(s string, deny bool) (compiledRequest, error) {
	text := strings.TrimSpace(s)
	written := text
	if deny {
		written = "!" + text
	}
	fail := func(reason string) (compiledRequest, error) {
		return compiledRequest{}, &EntryError{Entry: written, Reason: reason}
	}
	methodsText, target := "", text
	if i := strings.IndexAny(text, " \t"); i >= 0 {
		methodsText, target = text[:i], strings.TrimSpace(text[i+1:])
	}
	if strings.Contains(target, "://") || strings.Contains(target, "@") {
		return fail(errURLEntry.Error())
	}
	methods, err := parseMethods(methodsText)
	if err != nil {
		return fail(err.Error())
	}
	hostPort, pattern, ok := strings.Cut(target, "/")
	if !ok {
		return fail("a request entry needs a path after the host: api.github.com/repos/** (the whole host: api.github.com)")
	}
	e, err := parseEntryText(hostPort)
	if err != nil {
		return fail(err.Error())
	}
	if e.kind != kindName && e.kind != kindWildcard {
		return fail(`request rules name a host ("api.github.com", "*.github.com"), not an address or "*"`)
	}
	if deny {
		if _, port, _ := splitEntry(hostPort); port == "" {
			e.rule.ports = anyPort
		}
	}
	segs, err := parsePattern("/" + pattern)
	if err != nil {
		return fail(err.Error())
	}
	e.rule.text = written
	e.rule.requestsOnly = true
	return compiledRequest{host: e, segments: segs, rule: &requestRule{text: written, methods: methods, ports: e.rule.ports}}, nil
}

// parsePattern splits a path pattern into segments: literal ones decoded
// as paths are, "*" and "**" kept as they are.
func parsePattern(p string) ([]string, error) {
	var segs []string
	stars := 0
	parts := strings.Split(p[1:], "/")
	for i, part := range parts {
		switch {
		case part == "*":
		case part == "**":
			stars++
			if stars > maxDoubleStars {
				return nil, fmt.Errorf(`at most %d "**" in a path pattern`, maxDoubleStars)
			}
		case part == "" && i == len(parts)-1:
			continue // a trailing slash
		case part == "", part == ".", part == "..":
			return nil, fmt.Errorf("path pattern %q has an empty, . or .. segment: write it as it resolves", p)
		case strings.Contains(part, ";"):
			return nil, fmt.Errorf(`path pattern %q has a ";": parameters are dropped from paths before matching`, p)
		case strings.Contains(part, "*"):
			return nil, fmt.Errorf(`path pattern %q: "*" and "**" stand for whole segments only`, p)
		default:
			seg, why := decodeSegment(part)
			if why != "" {
				return nil, fmt.Errorf("path pattern %q: %s", p, strings.TrimPrefix(why, "the request path "))
			}
			part = seg
		}
		segs = append(segs, part)
		if len(segs) > MaxPathSegments {
			return nil, fmt.Errorf("path pattern %q is deeper than %d segments", p, MaxPathSegments)
		}
	}
	return segs, nil
}

// insert adds a pattern's rule to the trie.
func (n *pathNode) insert(segs []string, r *requestRule) {
	for _, s := range segs {
		var child **pathNode
		switch s {
		case "*":
			child = &n.one
		case "**":
			child = &n.many
		default:
			if n.next == nil {
				n.next = map[string]*pathNode{}
			}
			c := n.next[s]
			if c == nil {
				c = &pathNode{}
				n.next[s] = c
			}
			n = c
			continue
		}
		if *child == nil {
			*child = &pathNode{}
		}
		n = *child
	}
	n.rules = append(n.rules, r)
}

// find returns the first rule whose pattern matches segs and that admits
// the request q: literal segments first, then "*", then "**".
func (n *pathNode) find(segs []string, q *requestQuery) *requestRule {
	if len(segs) == 0 {
		for _, r := range n.rules {
			if q.admits(r) {
				return r
			}
		}
	} else {
		if c := n.next[segs[0]]; c != nil {
			if r := c.find(segs[1:], q); r != nil {
				return r
			}
		}
		if n.one != nil {
			if r := n.one.find(segs[1:], q); r != nil {
				return r
			}
		}
	}
	if n.many != nil {
		for i := 0; i <= len(segs); i++ {
			if r := n.many.find(segs[i:], q); r != nil {
				return r
			}
		}
	}
	return nil
}

// requestQuery is one request being judged against request rules.
type requestQuery struct {
	method string
	port   uint16
	deny   bool // deny rules match methods whatever their case
	mcp    bool // an MCP endpoint, whatever the method
}

func (q *requestQuery) admits(r *requestRule) bool {
	return (q.mcp || r.methods.has(q.method, q.deny)) && (&rule{ports: r.ports}).allowsPort(q.port)
}

// methodSet is a set of HTTP methods; the zero set holds every method.
type methodSet struct {
	known uint16   // bits of knownMethods
	other []string // methods outside it, as written
}

var knownMethods = [...]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}

func methodBit(m string) uint16 {
	for i, k := range knownMethods {
		if m == k {
			return 1 << i
		}
	}
	return 0
}

// parseMethods parses "GET,HEAD" (written in any case; methods are
// upper-case tokens) or "" (every method).
func parseMethods(s string) (methodSet, error) {
	var set methodSet
	if s == "" {
		return set, nil
	}
	for _, m := range strings.Split(s, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" || strings.IndexFunc(m, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return methodSet{}, fmt.Errorf("%q is not an HTTP method (GET,HEAD POST …, comma-separated, before a space)", m)
		}
		if b := methodBit(m); b != 0 {
			set.known |= b
		} else {
			set.other = append(set.other, m)
		}
	}
	return set, nil
}

func isTokenChar(r rune) bool {
	return 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// has reports whether the set holds method: exactly as sent (methods are
// case-sensitive), or in any case when fold is set, so that a deny entry
// for DELETE also refuses "delete", which some servers take for it.
func (m methodSet) has(method string, fold bool) bool {
	if m.known == 0 && m.other == nil {
		return true
	}
	if fold {
		for i, k := range knownMethods {
			if m.known&(1<<i) != 0 && strings.EqualFold(method, k) { // not a name: a method
				return true
			}
		}
		for _, o := range m.other {
			if strings.EqualFold(method, o) { // not a name: a method
				return true
			}
		}
		return false
	}
	if b := methodBit(method); b != 0 {
		return m.known&b != 0
	}
	for _, o := range m.other {
		if method == o {
			return true
		}
	}
	return false
}

// addRequest indexes a request entry: its path pattern in the trie of its
// name (or wildcard), and its host in the name's rules, so that the
// stages before a request (DNS, TLS, the connection) allow the host, or
// know that a deny entry needs its requests seen; and counts it.
func (p *Policy) addRequest(c compiledRequest, deny bool) {
	nr := p.names[c.host.name]
	if nr == nil {
		nr = &nameRules{}
		p.names[c.host.name] = nr
	}
	rr := &nr.reqExact
	if c.host.kind == kindWildcard {
		rr = &nr.reqWild
	}
	if *rr == nil {
		*rr = &requestRules{}
	}
	p.size++
	switch {
	case deny:
		(*rr).deny.insert(lowerSegments(c.segments), c.rule)
		(*rr).judgedHosts = addHostRule((*rr).judgedHosts, c.host.rule)
		p.judged = true
		return
	case c.rule.mcp != nil:
		(*rr).mcp.insert(lowerSegments(c.segments), c.rule)
		(*rr).judgedHosts = addHostRule((*rr).judgedHosts, c.host.rule)
		p.judged = true
	default:
		(*rr).allow.insert(c.segments, c.rule)
	}
	p.allowedPorts = p.allowedPorts.add(c.host.rule.ports...)
	if c.host.kind == kindWildcard {
		nr.allowWild = addHostRule(nr.allowWild, c.host.rule)
	} else {
		nr.allowExact = addHostRule(nr.allowExact, c.host.rule)
	}
}

// addRequests compiles and indexes request entries (allow and deny) and
// MCP endpoints, and returns the errors of those that do not compile.
func (p *Policy) addRequests(allow, deny []string, mcp []MCPEndpoint) []error {
	var errs []error
	add := func(c compiledRequest, err error, deny bool) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		p.addRequest(c, deny)
	}
	for _, s := range allow {
		c, err := compileRequestEntry(s, false)
		add(c, err, false)
	}
	for _, e := range mcp {
		c, err := compileMCP(e)
		add(c, err, false)
	}
	for _, s := range deny {
		c, err := compileRequestEntry(s, true)
		add(c, err, true)
	}
	return errs
}

// addHostRule adds a request entry's host rule unless one for the same
// ports is there: a thousand entries on a host are one rule for its
// connections, so judging those costs no more than for one.
func addHostRule(rules []rule, r rule) []rule {
	for _, have := range rules {
		if have.requestsOnly && slices.Equal(have.ports, r.ports) {
			return rules
		}
	}
	return append(rules, r)
}

// DecideRequest answers whether one HTTP request may go to host on port:
// the host as Decide judges it, then the request entries for it by the
// request's method and path (escaped, as sent; a query is ignored). A
// deny entry for the request wins; a host allowed in full allows every
// other request; a host allowed by request entries only allows the
// requests one of them matches. Servers differ on whether an encoded
// slash ("%2F") separates segments: a deny entry matches if either
// reading matches, an allow entry only if both do ("*" matches "a%2Fb"
// only where "**" would); paths are case-sensitive for an allow entry,
// and matched in any case for a deny entry and an MCP endpoint. A path
// that does not normalise cleanly is refused on a host with request
// entries (see appendPath for the rules), and never consulted on others.
//
// Deciding a request on a path that needs no decoding allocates nothing.
func (p *Policy) DecideRequest(host string, port uint16, method, path string) Decision {
	d := p.Decide(host, port)
	if !d.Allowed || d.Report || !d.Requests {
		return d
	}
	var buf [32]string
	segs, why := appendPath(buf[:0], path)
	if why != "" {
		return p.finish(Decision{Name: d.Name, Reason: why})
	}
	// A deny entry matches the path as read either way: with encoded
	// slashes inside their segments, or split at them; and in any case.
	lower := lowerSegments(segs)
	split := splitEncodedSlashes(lower)
	if len(split) > MaxPathSegments {
		return p.finish(Decision{Name: d.Name, Reason: ReasonPathTooDeep})
	}
	find := func(q *requestQuery) *requestRule {
		r := p.findRequest(d.Name, q, lower)
		if r == nil && len(split) != len(lower) {
			r = p.findRequest(d.Name, q, split)
		}
		return r
	}
	if r := find(&requestQuery{method: method, port: port, deny: true}); r != nil {
		return p.finish(Decision{Name: d.Name, Rule: r.text, Reason: ReasonDenyEntry})
	}
	// An MCP endpoint is its entry's, whatever else allows the host: its
	// methods only, its messages judged. It is found as a deny entry is:
	// a server that folds a path's case (Express) or decodes its encoded
	// slashes (a handler of Go's r.URL.Path) serves the endpoint at those
	// paths too, and another entry's allowing them must not skip the
	// judge.
	if r := find(&requestQuery{port: port, mcp: true}); r != nil {
		if !r.methods.has(method, false) {
			return p.finish(Decision{Name: d.Name, Rule: r.text, Reason: ReasonNoRequestRule})
		}
		return Decision{Allowed: true, Name: d.Name, Rule: r.text, Reason: ReasonAllowedByRule, Requests: true, mcp: r.mcp}
	}
	if d.Reason != ReasonRequestRules {
		return d // the host is allowed in full; its request entries only deny
	}
	allow := &requestQuery{method: method, port: port}
	r := p.findRequest(d.Name, allow, segs)
	if split := splitEncodedSlashes(segs); r != nil && len(split) != len(segs) {
		// And as a server that decodes encoded slashes reads it, so that
		// "%2F" cannot stretch a "*" over more than one segment.
		r = p.findRequest(d.Name, allow, split)
	}
	if r != nil {
		return Decision{Allowed: true, Name: d.Name, Rule: r.text, Reason: ReasonAllowedByRule, Requests: true}
	}
	return p.finish(Decision{Name: d.Name, Reason: ReasonNoRequestRule})
}

// lowerSegments is segs in lower case, for deny entries, which match a
// path whatever its case: some servers (GitHub's owners and repositories,
// IIS) fold it. It is segs itself when they are in lower case already.
func lowerSegments(segs []string) []string {
	for i, s := range segs {
		if l := strings.ToLower(s); l != s { // not a name: a path segment
			out := slices.Clone(segs)
			for j := i; j < len(out); j++ {
				out[j] = strings.ToLower(out[j]) // not a name: a path segment
			}
			return out
		}
	}
	return segs
}

// findRequest finds a request entry for name (exact, then wildcards from
// the nearest) that matches q and segs: a deny entry when q.deny.
func (p *Policy) findRequest(name string, q *requestQuery, segs []string) *requestRule {
	pick := func(rr *requestRules) *requestRule {
		if rr == nil {
			return nil
		}
		switch {
		case q.deny:
			return rr.deny.find(segs, q)
		case q.mcp:
			return rr.mcp.find(segs, q)
		}
		return rr.allow.find(segs, q)
	}
	if nr := p.names[name]; nr != nil {
		if r := pick(nr.reqExact); r != nil {
			return r
		}
	}
	var found *requestRule
	hostname.Suffixes(name, func(suffix string) bool {
		if nr := p.names[suffix]; nr != nil {
			found = pick(nr.reqWild)
		}
		return found == nil
	})
	return found
}

// needsRequests reports whether a deny request entry or an MCP endpoint
// concerns name on port: then its requests must be seen, whatever
// allows it. A policy without either (most) answers at once: every
// decision asks.
func (p *Policy) needsRequests(name string, port uint16) bool {
	if !p.judged {
		return false
	}
	m := matcher{port: port}
	if nr := p.names[name]; nr != nil && nr.reqExact != nil {
		if _, ok := m.match(nr.reqExact.judgedHosts); ok {
			return true
		}
	}
	found := false
	hostname.Suffixes(name, func(suffix string) bool {
		if nr := p.names[suffix]; nr != nil && nr.reqWild != nil {
			_, found = m.match(nr.reqWild.judgedHosts)
		}
		return !found
	})
	return found
}

// JudgesRequests reports whether the policy judges name's requests on
// port one by one whatever allows the name (a deny request entry, an MCP
// endpoint): then a proxy must not let an address entry carry them
// unseen.
func (p *Policy) JudgesRequests(name string, port uint16) bool {
	if p == nil {
		return false
	}
	n, err := hostname.Normalize(name)
	return err == nil && p.needsRequests(n, port)
}
