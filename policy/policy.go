package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/agenthold/egress/internal/hostname"
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
	switch strings.ToLower(strings.TrimSpace(s)) {
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
	Allow []string // allow entries; see New for the forms
	// AllowPrivateNetworks lets destinations in the private tier (RFC 1918,
	// unique local IPv6, CGNAT) be dialled. It never lifts the never tier.
	AllowPrivateNetworks bool
	// Report decides as the policy would but allows what it would deny,
	// marking the decision (a dry run).
	Report bool
	// Quotas bound what the agent may take of a shared gateway.
	Quotas Quotas
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
}

// AgentFunc identifies the agent behind a source address and returns its
// current policy; ok false means the source is unknown, which every
// caller refuses. dnsfilter and tproxy take one to know whose policy
// judges a query or a connection.
type AgentFunc func(src netip.Addr) (agent string, p *Policy, ok bool)

// Policy is a compiled, immutable policy, safe for concurrent use. A nil
// *Policy denies everything.
type Policy struct {
	mode         Mode
	allowPrivate bool
	report       bool
	denyReason   string            // for DenyAll: why
	exact        map[string][]rule // name → rules
	wildcard     map[string][]rule // suffix → rules for its subdomains
	any          []rule            // "*" entries
	prefixes     *netguard.PrefixMap[[]rule]
	size         int
	quotas       Quotas // defaults resolved
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
		denyReason:   ReasonDenyAll,
		exact:        map[string][]rule{},
		wildcard:     map[string][]rule{},
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
	var prefixes []netguard.PrefixEntry[[]rule]
	var errs []error
	for _, s := range cfg.Allow {
		e, err := compileEntry(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch e.kind {
		case kindName:
			p.exact[e.name] = append(p.exact[e.name], e.rule)
		case kindWildcard:
			p.wildcard[e.name] = append(p.wildcard[e.name], e.rule)
		case kindAny:
			p.any = append(p.any, e.rule)
		case kindPrefix:
			prefixes = append(prefixes, netguard.PrefixEntry[[]rule]{Prefix: e.prefix, Value: []rule{e.rule}})
		}
		p.size++
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// A prefix's rules include those of every prefix around it, the most
	// specific first, so one lookup finds every rule for an address.
	p.prefixes = netguard.NewPrefixMap(prefixes, func(outer, inner []rule) []rule {
		return append(append(make([]rule, 0, len(inner)+len(outer)), inner...), outer...)
	})
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
	return d
}

func (p *Policy) judgeName(name string, port uint16, anyPort bool) Decision {
	if d, done := p.modeDecision(); done {
		return d
	}
	if p.mode == Open {
		return Decision{Allowed: true, Reason: ReasonOpen}
	}
	m := matcher{port: port, anyPort: anyPort, miss: Decision{Reason: ReasonNoRule}}
	if d, ok := m.match(p.exact[name]); ok {
		return d
	}
	var found Decision
	hostname.Suffixes(name, func(suffix string) bool {
		d, ok := m.match(p.wildcard[suffix])
		if ok {
			found = d
		}
		return !ok
	})
	if found.Allowed {
		return found
	}
	if d, ok := m.match(p.any); ok {
		return d
	}
	return p.finish(m.miss)
}

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
	if p.mode == Open {
		return Decision{Allowed: true, Reason: ReasonOpen}
	}
	m := matcher{port: port, miss: Decision{Reason: ReasonNoRule}}
	rules, _ := p.prefixes.Lookup(a)
	if d, ok := m.match(rules); ok {
		return d
	}
	if d, ok := m.match(p.any); ok {
		return d
	}
	return p.finish(m.miss)
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
	miss    Decision
}

func (m *matcher) match(rules []rule) (Decision, bool) {
	for i := range rules {
		if m.anyPort || rules[i].allowsPort(m.port) {
			return Decision{Allowed: true, Rule: rules[i].text, Reason: ReasonAllowedByRule}, true
		}
	}
	if len(rules) > 0 && m.miss.Rule == "" {
		m.miss = Decision{Rule: rules[0].text, Reason: ReasonPortNotListed}
	}
	return Decision{}, false
}
