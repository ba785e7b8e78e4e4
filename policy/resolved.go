package policy

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/netguard"
)

// CheckResolved judges an address that host (an allowed name) resolved
// to, at dial time: a deny entry covering the address refuses it, and so
// does a DNS-over-HTTPS resolver's address unless an entry names host
// exactly. The name's own decision stays the caller's; for an IP literal
// host, whose address was judged already, it returns nil. The error is a
// *ResolvedError; in report mode it is nil.
func (p *Policy) CheckResolved(host string, ap netip.AddrPort) error {
	if p == nil {
		return &ResolvedError{Reason: ReasonNoPolicy}
	}
	if _, err := netguard.ParseLiteral(host); err == nil {
		return nil
	}
	a := ap.Addr().WithZone("").Unmap()
	var d Decision
	if dd, denied := p.denyAddr(a, ap.Port()); denied {
		d = dd
	} else if p.isDoHAddr(a) {
		name, err := hostname.Normalize(host)
		if err == nil {
			if nr := p.names[name]; nr != nil {
				m := matcher{port: ap.Port()}
				if _, exact := m.match(nr.allowExact); exact {
					return nil
				}
			}
		}
		d = Decision{Reason: ReasonDoH}
	} else {
		return nil
	}
	if d = p.finish(d); d.Allowed {
		return nil
	}
	return &ResolvedError{Host: host, Addr: a, Rule: d.Rule, Reason: d.Reason}
}

// ResolvedError is CheckResolved's refusal of an address a name resolved
// to.
type ResolvedError struct {
	Host   string
	Addr   netip.Addr
	Rule   string
	Reason string
}

func (e *ResolvedError) Error() string {
	return fmt.Sprintf("policy: %s resolved to %s: %s", e.Host, e.Addr, e.Reason)
}

// Is makes errors.Is(err, netguard.ErrDenied) true: like netguard's own
// refusals, it refuses an address at dial time, and whoever reports the
// dial says so (a denial, not a failure).
func (e *ResolvedError) Is(target error) bool { return target == netguard.ErrDenied }

// WithPolicy returns a context carrying the policy a request is sent
// under, for the dialler's CheckResolved (see DialCheck).
func WithPolicy(ctx context.Context, p *Policy) context.Context {
	return context.WithValue(ctx, policyKey{}, p)
}

// DialCheck is a netguard.Dialer Check that applies CheckResolved
// of the policy WithPolicy put in ctx. Without one it refuses, as a nil
// policy does (ReasonNoPolicy): a path that forgot WithPolicy would
// otherwise dial past every per-address rule.
func DialCheck(ctx context.Context, host string, ap netip.AddrPort) error {
	p, _ := ctx.Value(policyKey{}).(*Policy)
	return p.CheckResolved(host, ap)
}

type policyKey struct{}
