package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/internal/prefixmap"
	"github.com/agenthold/egress/netguard"
)

// Mode is how a policy treats destinations. The zero Mode is Allowlist,
// as in a policy file without a mode: with no allow entry, it allows
// nothing.
type Mode uint8

const (
	// Allowlist allows only what an allow entry names.
	Allowlist Mode = iota
	// DenyAll denies every destination, whatever the entries say.
	DenyAll
	// Open allows every public destination on every port.
	Open
)

func (m Mode) String() string {
	switch m {
	case DenyAll:
		return "deny"
	case Allowlist:
		return "allowlist"
	case Open:
		return "open"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses "open", "allowlist", or "deny" (also "deny-all").
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) { // not a name: a mode
	case "open":
		return Open, nil
	case "allowlist":
		return Allowlist, nil
	case "deny", "deny-all":
		return DenyAll, nil
	}
	return DenyAll, fmt.Errorf("policy: unknown mode %q (want open, allowlist or deny)", s) // an error path that denies
}

// Config is a policy before compilation. The zero Config is an allowlist
// with no entry: it allows nothing.
type Config struct {
	Mode  Mode     // zero means Allowlist
	Allow []string // allow entries, and deny entries written "!entry"; see New for the forms
	// Deny entries, in the forms of allow entries: a deny entry wins over
	// every allow entry and over open mode. Without a port, it denies
	// every port.
	Deny []string
	// DoHEndpoints add names and addresses to the built-in list of public
	// DNS-over-HTTPS resolvers (KnownDoHEndpoints), which only an entry
	// that names them exactly allows.
	DoHEndpoints []string
	// AllowPrivateNetworks lets destinations in the private tier (RFC 1918,
	// unique local IPv6, CGNAT) be dialled. It never lifts the never tier.
	AllowPrivateNetworks bool
	// Report decides as the policy would but allows what it would deny,
	// marking the decision (a dry run).
	Report bool
	// Quotas bound what the agent may take of a shared gateway.
	Quotas Quotas
	// MCP allows MCP servers' endpoints and the tools an agent may call
	// on them (also written as allow entries: "mcp URL tools=a,b").
	MCP []MCPEndpoint
	// Ask marks the decisions on names that no entry allows, and nothing
	// refuses outright, as askable (Decision.Askable): an Approver may
	// then hold them while a person answers (see Ask).
	Ask bool
}

// Reasons a Decision gives. They are constants so that deciding never
// allocates; the Decision's host, port and rule complete them in a log.
const (
	ReasonAllowedByRule = "allowed by rule"
	ReasonOpen          = "open policy allows any public destination"
	ReasonNoRule        = "no allow entry matches the host"
	ReasonPortNotListed = "an allow entry matches the host but not the port"
	ReasonInvalidHost   = "host is not a valid name or address"
	ReasonNoPolicy      = "no policy"
	ReasonDenyAll       = "policy denies all"
	ReasonUnknownMode   = "policy has an unknown mode"
	ReasonDenyEntry     = "a deny entry matches"
	ReasonDoT           = "DNS over TLS (port 853) needs an allow entry that names port 853"
	ReasonDoH           = "a public DNS-over-HTTPS resolver needs an allow entry that names it exactly"
)

// Decision is the answer to "may this agent reach this destination". The
// zero Decision denies.
type Decision struct {
	Allowed bool
	// Report is set when the policy is in report mode and allowed what
	// enforcement would deny: Reason then says why enforcement would deny.
	Report bool
	Rule   string // the allow entry that matched, as written, or ""
	Reason string
	// Name is the canonical name that was judged, or Addr the address
	// (IPv4-mapped addresses unmapped): what the caller must resolve or
	// dial, so that it reaches exactly what was judged. Both are empty
	// for a host that is neither.
	Name string
	Addr netip.Addr
	// Requests is set on an allowed decision when each request to the
	// host must be judged by DecideRequest: request entries allow the
	// host for some requests only (Reason is then ReasonRequestRules), or
	// a deny entry refuses some of its requests. A connection whose
	// requests cannot be seen (TLS that is not intercepted, other TCP)
	// must then be refused.
	Requests bool
	// Tool names the MCP tools a request calls (comma-separated, for a
	// batch), as DecideHTTP read them.
	Tool string
	// JSONRPCReply, on a refused MCP message, is the JSON-RPC answer that
	// tells the client: an error (MCPErrorCode) for each request in it. A
	// proxy answers it with status 200 rather than 403, so that the
	// client's session goes on (MCP clients end a session on an HTTP
	// error). Empty when there is no request to answer.
	JSONRPCReply string
	// Askable is set on a denial of a name that the policy, in ask mode,
	// would rather ask a person about (see Ask); Approved on an allowed
	// decision that an Approver's answer made.
	Askable, Approved bool
	mcp               *mcpRule       // the MCP endpoint whose messages DecideHTTP judges
	request           *judgedRequest // what DecideHTTP read, for DecideAgain
}

// AgentFunc identifies the agent behind a source address and returns its
// current policy; ok false means the source is unknown, which every
// caller refuses. dnsfilter and tproxy take one to know whose policy
// judges a query or a connection.
type AgentFunc func(src netip.Addr) (agent string, p *Policy, ok bool)

// Current returns an agent's policy as it is now, or nil once the agent is
// gone (a nil policy denies everything). Whatever outlives one decision (a
// kept-alive connection, an intercepted one, a tunnel) holds a Current,
// never a *Policy, and asks it for every request: a policy change applies
// to the next request on a connection opened before it.
type Current func() *Policy

// Policy is a compiled, immutable policy, safe for concurrent use. A nil
// *Policy denies everything.
type Policy struct {
	mode         Mode
	allowPrivate bool
	report       bool
	ask          bool
	judged       bool                  // some deny request entry or MCP endpoint: requests to judge whatever allows them
	denyReason   string                // for DenyAll: why
	names        map[string]*nameRules // a name, or a suffix for its subdomains
	allow        ruleSet
	deny         ruleSet
	doh          map[string]bool     // DoH resolvers' names
	dohAddrs     map[netip.Addr]bool // and addresses
	size         int
	quotas       Quotas // defaults resolved
	// allowedPorts are the ports some allow entry admits, and namedPorts
	// those some entry names by itself (for DNS over TLS), for DecidePort.
	allowedPorts, namedPorts portSet
}

// nameRules are the entries for one name: those for the name itself,
// and the wildcards for its subdomains, allow and deny alike, so that one
// lookup per label of a name finds them all.
type nameRules struct {
	allowExact, allowWild, denyExact, denyWild []rule
	// The request entries for the name itself, and for its subdomains.
	reqExact, reqWild *requestRules
}

// ruleSet is the address and "*" entries of one kind, allow or deny.
type ruleSet struct {
	any      []rule // "*" entries
	prefixes *prefixmap.Map[[]rule]
	pending  []prefixmap.Entry[[]rule] // while compiling
}

// add indexes an entry: names in p.names, the rest in the ruleSet of
// its kind.
func (p *Policy) add(e entry, deny bool) {
	rs := &p.allow
	if deny {
		rs = &p.deny
	}
	switch e.kind {
	case kindName, kindWildcard:
		nr := p.names[e.name]
		if nr == nil {
			nr = &nameRules{}
			p.names[e.name] = nr
		}
		switch {
		case e.kind == kindName && deny:
			nr.denyExact = append(nr.denyExact, e.rule)
		case e.kind == kindName:
			nr.allowExact = append(nr.allowExact, e.rule)
		case deny:
			nr.denyWild = append(nr.denyWild, e.rule)
		default:
			nr.allowWild = append(nr.allowWild, e.rule)
		}
	case kindAny:
		rs.any = append(rs.any, e.rule)
	case kindPrefix:
		rs.pending = append(rs.pending, prefixmap.Entry[[]rule]{Prefix: e.prefix, Value: []rule{e.rule}})
	}
}

// seal builds the prefix map: a prefix's rules include those of every
// prefix around it, the most specific first, so one lookup finds every
// rule for an address.
func (rs *ruleSet) seal() {
	rs.prefixes = prefixmap.New(rs.pending, func(outer, inner []rule) []rule {
		return append(append(make([]rule, 0, len(inner)+len(outer)), inner...), outer...)
	})
	rs.pending = nil
}

// matchAllowName finds the first allow rule for name (exact, then the
// nearest wildcard, then "*") that m accepts.
func (p *Policy) matchAllowName(m *matcher, name string) (Decision, bool) {
	if nr := p.names[name]; nr != nil {
		if d, ok := m.match(nr.allowExact); ok {
			return d, true
		}
	}
	var found Decision
	var ok bool
	hostname.Suffixes(name, func(suffix string) bool {
		if nr := p.names[suffix]; nr != nil {
			found, ok = m.match(nr.allowWild)
		}
		return !ok
	})
	if ok {
		return found, true
	}
	return m.match(p.allow.any)
}

// matchAddr finds the first rule for an address (prefixes, then "*").
func (rs *ruleSet) matchAddr(m *matcher, a netip.Addr) (Decision, bool) {
	rules, _ := rs.prefixes.Lookup(a)
	if d, ok := m.match(rules); ok {
		return d, true
	}
	return m.match(rs.any)
}

// New compiles a policy. Every allow entry must parse; an error names the
// first entry that does not and why.
//
// Entry forms: "github.com" (ports 80 and 443), "github.com:22",
// "registry.example.com:*", "example.com:8000-8100", "*.npmjs.org" (every
// subdomain, never the apex), "203.0.113.0/24:443", "[2001:db8::/32]:443",
// bare addresses, and "*" (every public destination, any port; "*:443"
// limits the port).
func New(cfg Config) (*Policy, error) {
	p := &Policy{
		mode:         cfg.Mode,
		allowPrivate: cfg.AllowPrivateNetworks,
		report:       cfg.Report,
		ask:          cfg.Ask,
		denyReason:   ReasonDenyAll,
		names:        map[string]*nameRules{},
		doh:          map[string]bool{},
		dohAddrs:     map[netip.Addr]bool{},
		quotas:       cfg.Quotas.withDefaults(),
	}
	if err := cfg.Quotas.check(); err != nil {
		return nil, err
	}
	switch cfg.Mode {
	case DenyAll, Allowlist, Open:
	default:
		return nil, fmt.Errorf("policy: unknown mode %v", cfg.Mode)
	}
	var errs []error
	deny := append([]string(nil), cfg.Deny...)
	mcp := slices.Clone(cfg.MCP)
	var requests, denyRequests []string // request entries, compiled after the rest
	for _, s := range cfg.Allow {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s), "!"); ok {
			deny = append(deny, rest)
			continue
		}
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s), "mcp "); ok {
			e, err := parseMCPEntry(rest)
			if err != nil {
				errs = append(errs, &EntryError{Entry: s, Reason: err.Error()})
				continue
			}
			mcp = append(mcp, e)
			continue
		}
		if isRequestEntry(strings.TrimSpace(s)) {
			requests = append(requests, s)
			continue
		}
		e, err := compileEntry(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.add(e, false)
		p.size++
		p.allowedPorts = p.allowedPorts.add(e.rule.ports...)
		for _, pr := range e.rule.ports {
			if pr.lo == pr.hi {
				p.namedPorts = p.namedPorts.add(pr)
			}
		}
	}
	for _, s := range deny {
		if isRequestEntry(strings.TrimSpace(s)) {
			denyRequests = append(denyRequests, s)
			continue
		}
		e, err := compileDenyEntry(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.add(e, true)
		p.size++
		if e.kind == kindWildcard {
			// "!*.ngrok.io" means the whole domain: unlike an allow
			// entry's wildcard, it covers the name itself too.
			apex := e
			apex.kind = kindName
			p.add(apex, true)
		}
	}
	errs = append(errs, p.addRequests(requests, denyRequests, mcp)...)
	for _, s := range append(slices.Clone(knownDoH), cfg.DoHEndpoints...) {
		if a, err := netguard.ParseLiteral(s); err == nil {
			p.dohAddrs[a.WithZone("").Unmap()] = true
		} else if name, err := NormalizeName(s); err == nil {
			p.doh[name] = true
		} else {
			errs = append(errs, &EntryError{Entry: s, Reason: "not a DNS-over-HTTPS resolver's name or address"})
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	p.allow.seal()
	p.deny.seal()
	return p, nil
}

// Deny returns a policy that denies everything, giving reason as the
// Decision's reason: "policy file absent", "enforce is false".
func Deny(reason string) *Policy {
	return &Policy{mode: DenyAll, denyReason: reason, quotas: Quotas{}.withDefaults()}
}

// Mode returns the policy's mode.
func (p *Policy) Mode() Mode {
	if p == nil {
		return DenyAll
	}
	return p.mode
}

// AllowPrivateNetworks reports whether private-tier addresses may be
// dialled under this policy.
func (p *Policy) AllowPrivateNetworks() bool { return p != nil && p.allowPrivate }

// Len reports the number of allow entries.
func (p *Policy) Len() int {
	if p == nil {
		return 0
	}
	return p.size
}

// DenyReason says why a deny-all policy denies ("" otherwise).
func (p *Policy) DenyReason() string {
	switch {
	case p == nil:
		return ReasonNoPolicy
	case p.mode == DenyAll:
		return p.denyReason
	}
	return ""
}

// Decide answers whether host (a name, or an IP literal in any spelling)
// may be reached on port. Names are normalised first; a host that is
// neither a valid name nor an address is denied. It does not classify
// addresses: the dial through netguard does that.
func (p *Policy) Decide(host string, port uint16) Decision {
	a, err := netguard.ParseLiteral(host)
	if err == nil {
		return p.DecideAddr(a, port)
	}
	// An invalid host is denied even in report mode: nothing could dial it.
	if !errors.Is(err, netguard.ErrNotLiteral) {
		return Decision{Reason: ReasonInvalidHost}
	}
	return p.decideName(host, port, false)
}

// DecideName answers whether a name may be resolved: whether an allow
// entry matches it on any port (DNS carries no port; the connection is
// judged with its port later). An IP literal is not a name, and is denied.
func (p *Policy) DecideName(host string) Decision {
	return p.decideName(host, 0, true)
}

// decideName normalises and judges a name, and says which name it judged.
func (p *Policy) decideName(host string, port uint16, anyPort bool) Decision {
	name, err := hostname.Normalize(host)
	if err != nil {
		return Decision{Reason: ReasonInvalidHost}
	}
	d := p.judgeName(name, port, anyPort)
	d.Name = name
	d.Askable = p.askable(d, name, port)
	return d
}

func (p *Policy) judgeName(name string, port uint16, anyPort bool) Decision {
	if d, done := p.modeDecision(); done {
		return d
	}
	// One walk of the name and its suffixes finds the deny entries, which
	// win wherever they match, and the first (nearest) allow entry. A name
	// asked of on no port (a DNS lookup) is denied only by an entry that
	// denies it every port: "!ssh.example.com:22" leaves it resolvable.
	dm := matcher{port: port, anyPort: anyPort, allPorts: anyPort}
	m := matcher{port: port, anyPort: anyPort, miss: Decision{Reason: ReasonNoRule}}
	var d Decision
	var ok, exact bool
	if nr := p.names[name]; nr != nil {
		if dd, denied := dm.match(nr.denyExact); denied {
			return p.finish(Decision{Rule: dd.Rule, Reason: ReasonDenyEntry})
		}
		d, ok = m.match(nr.allowExact)
		exact = ok
	}
	var deny Decision
	var denied bool
	resolver := p.doh[name]
	hostname.Suffixes(name, func(suffix string) bool {
		// A resolver's subdomains (dns64.dns.google) answer too.
		resolver = resolver || p.doh[suffix]
		if nr := p.names[suffix]; nr != nil {
			if deny, denied = dm.match(nr.denyWild); denied {
				return false
			}
			if !ok {
				d, ok = m.match(nr.allowWild)
			}
		}
		return true
	})
	switch {
	case denied:
		return p.finish(Decision{Rule: deny.Rule, Reason: ReasonDenyEntry})
	case resolver && !exact:
		// A resolver that would answer any name over HTTPS: only an entry
		// for it by name, not a wildcard, "*" or open mode, lets it in.
		return p.finish(Decision{Rule: d.Rule, Reason: ReasonDoH})
	case resolver:
	case p.mode == Open:
		d, ok = Decision{Allowed: true, Reason: ReasonOpen}, true
	case !ok:
		d, ok = m.match(p.allow.any)
	}
	if !ok {
		return p.finish(m.miss)
	}
	if d.Requests {
		// Request entries allow the host for some requests; an entry, "*"
		// or open mode that allows it in full wins (for a DNS-over-HTTPS
		// resolver, only an entry for exactly it).
		full := matcher{port: port, anyPort: anyPort, fullOnly: true}
		var fd Decision
		var inFull bool
		switch {
		case resolver:
			if nr := p.names[name]; nr != nil {
				fd, inFull = full.match(nr.allowExact)
			}
		case p.mode == Open:
			fd, inFull = Decision{Allowed: true, Reason: ReasonOpen}, true
		default:
			fd, inFull = p.matchAllowName(&full, name)
		}
		if inFull {
			d = fd
		} else {
			d.Reason = ReasonRequestRules
		}
	}
	d = p.dotCheck(d, port, anyPort, func(m *matcher) (Decision, bool) { return p.matchAllowName(m, name) })
	if d.Allowed && !d.Requests && !anyPort {
		d.Requests = p.needsRequests(name, port)
	}
	return d
}

// DecideDoH answers whether a DNS-over-HTTPS request (a body of type
// application/dns-message, or a "dns" query parameter) may go to host on
// port: only when an allow entry names host exactly, whatever a wildcard,
// "*" or open mode say, since such a request resolves any name past the
// gateway's DNS.
func (p *Policy) DecideDoH(host string, port uint16) Decision {
	name, err := hostname.Normalize(host)
	if err != nil {
		return Decision{Reason: ReasonInvalidHost}
	}
	if d, done := p.modeDecision(); done {
		return d
	}
	m := matcher{port: port, miss: Decision{Reason: ReasonDoH}}
	if nr := p.names[name]; nr != nil {
		if d, ok := m.match(nr.allowExact); ok {
			d.Name = name
			return d
		}
	}
	d := p.finish(Decision{Reason: ReasonDoH})
	d.Name = name
	return d
}

// dotCheck keeps port 853 (DNS over TLS) for entries that name it: an
// allow decision for it by open mode, "*", or an entry of other ports
// (a range, ":*") is a denial unless some entry names 853 itself.
func (p *Policy) dotCheck(d Decision, port uint16, anyPort bool, match func(*matcher) (Decision, bool)) Decision {
	if port != dotPort || anyPort {
		return d
	}
	m := matcher{port: port, onlyExactPort: true}
	if named, ok := match(&m); ok {
		return named
	}
	return p.finish(Decision{Rule: d.Rule, Reason: ReasonDoT})
}

// dotPort is DNS over TLS's port (RFC 7858).
const dotPort = 853

// DecideAddr answers whether an address may be reached on port, by the
// address and prefix entries and "*".
func (p *Policy) DecideAddr(a netip.Addr, port uint16) Decision {
	if !a.IsValid() {
		return Decision{Reason: ReasonInvalidHost}
	}
	a = a.WithZone("").Unmap()
	d := p.judgeAddr(a, port)
	d.Addr = a
	return d
}

func (p *Policy) judgeAddr(a netip.Addr, port uint16) Decision {
	if d, done := p.modeDecision(); done {
		return d
	}
	if d, denied := p.denyAddr(a, port); denied {
		return p.finish(d)
	}
	if p.isDoHAddr(a) {
		// Only an entry for exactly this address lets a resolver's
		// address in.
		m := matcher{port: port, exactAddr: a, miss: Decision{Reason: ReasonDoH}}
		rules, _ := p.allow.prefixes.Lookup(a)
		if d, ok := m.match(rules); ok {
			return d
		}
		return p.finish(m.miss)
	}
	m := matcher{port: port, miss: Decision{Reason: ReasonNoRule}}
	var d Decision
	var ok bool
	if p.mode == Open {
		d, ok = Decision{Allowed: true, Reason: ReasonOpen}, true
	} else {
		d, ok = p.allow.matchAddr(&m, a)
	}
	if !ok {
		return p.finish(m.miss)
	}
	return p.dotCheck(d, port, false, func(m *matcher) (Decision, bool) { return p.allow.matchAddr(m, a) })
}

// denyAddr finds a deny entry that covers a on port, or an address a
// embeds (an IPv6 form that reaches an IPv4 address: NAT64, 6to4, Teredo).
func (p *Policy) denyAddr(a netip.Addr, port uint16) (Decision, bool) {
	dm := matcher{port: port}
	if d, ok := p.deny.matchAddr(&dm, a); ok {
		return Decision{Rule: d.Rule, Reason: ReasonDenyEntry}, true
	}
	inner, n := netguard.EmbeddedIPv4(a)
	for _, b := range inner[:n] {
		if d, ok := p.deny.matchAddr(&dm, b); ok {
			return Decision{Rule: d.Rule, Reason: ReasonDenyEntry}, true
		}
	}
	return Decision{}, false
}

// isDoHAddr reports whether a, or an address it embeds, is a known
// DNS-over-HTTPS resolver's.
func (p *Policy) isDoHAddr(a netip.Addr) bool {
	if p.dohAddrs[a] {
		return true
	}
	inner, n := netguard.EmbeddedIPv4(a)
	for _, b := range inner[:n] {
		if p.dohAddrs[b] {
			return true
		}
	}
	return false
}

// modeDecision settles the decision for policies that need no matching.
func (p *Policy) modeDecision() (Decision, bool) {
	switch {
	case p == nil:
		return Decision{Reason: ReasonNoPolicy}, true
	case p.mode == DenyAll:
		return p.finish(Decision{Reason: p.denyReason}), true
	case p.mode == Allowlist, p.mode == Open:
		return Decision{}, false
	}
	return Decision{Reason: ReasonUnknownMode}, true
}

// finish applies report mode to a denial.
func (p *Policy) finish(d Decision) Decision {
	if p.report && !d.Allowed {
		d.Allowed, d.Report = true, true
	}
	return d
}

// matcher finds the first rule that allows a port (or any port), and
// remembers a rule that matched the host but not the port.
type matcher struct {
	port    uint16
	anyPort bool
	// onlyExactPort takes only rules that name the port alone; allPorts
	// only rules for every port; exactAddr, when valid, only rules for
	// exactly that address.
	onlyExactPort bool
	allPorts      bool
	exactAddr     netip.Addr
	// fullOnly skips request entries' hosts.
	fullOnly bool
	miss     Decision
}

func (m *matcher) match(rules []rule) (Decision, bool) {
	for i := range rules {
		r := &rules[i]
		switch {
		case m.exactAddr.IsValid() && r.addr != m.exactAddr:
			continue
		case m.onlyExactPort && !r.namesPort(m.port):
			continue
		case m.allPorts && !r.coversAllPorts():
			continue
		case m.fullOnly && r.requestsOnly:
			continue
		}
		if m.anyPort || r.allowsPort(m.port) {
			return Decision{Allowed: true, Rule: r.text, Reason: ReasonAllowedByRule, Requests: r.requestsOnly}, true
		}
		if m.miss.Rule == "" {
			m.miss = Decision{Rule: r.text, Reason: ReasonPortNotListed}
		}
	}
	return Decision{}, false
}
