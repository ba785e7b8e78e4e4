package policy

import (
	"context"
	"strings"
)

// Ask mode: a name that no entry allows, and that nothing refuses
// outright (a deny entry, a DNS side door), is asked about rather than
// refused. The decision says so (Decision.Askable), and an Approver holds
// the query or connection while a person or a policy service answers.
// Addresses are never asked about: only names are, and the dial still
// refuses the private and never tiers whatever the answer.

// Reasons of ask mode.
const (
	ReasonApprovalTimeout = "no answer to the approval request in time"
	ReasonApprovalDenied  = "refused by approval"
	ReasonApprovalBusy    = "too many requests of this agent wait for approval"
	ReasonApprovalGone    = "the approval request was dropped (agent removed or gateway stopping)"
)

// BoundReasons are the reasons of refusals for an Approver's bound on an
// agent's requests waiting for approval, which whoever counts refusals
// per agent counts however many other reasons an agent provokes.
func BoundReasons() []string {
	return []string{ReasonApprovalBusy}
}

// An Approver answers for the destinations a policy in ask mode would
// refuse for want of an entry. Approve holds the caller until the
// destination is approved, refused, or ctx is done, and returns the
// decision to apply: allowed, saying by whom and how, or q.Refusal with
// the reason no approval came.
type Approver interface {
	Approve(ctx context.Context, q ApprovalQuery) Decision
}

// ApprovalQuery is one query or connection waiting for approval.
type ApprovalQuery struct {
	Agent string
	Name  string // canonical
	Port  uint16 // 0 for a DNS lookup
	Kind  string // what asks: "dns", "tls", "http", "connect"
	// Refusal is the policy's decision, which stands when no approval
	// comes.
	Refusal Decision
}

// Ask is where the blocks ask: d unchanged unless it is askable and an
// Approver is set, else the Approver's answer for agent's d on port (0
// for a lookup). An approval is checked against current, the agent's
// policy when it comes: what that policy allows is its decision, and what
// it refuses outright (a deny entry added while the request waited, a
// mode that no longer asks, a name whose requests entries now judge)
// stays refused, whatever the answer.
func Ask(ctx context.Context, a Approver, agent string, d Decision, port uint16, kind string, current Current) Decision {
	if a == nil || !d.Askable || d.Name == "" {
		return d
	}
	out := a.Approve(ctx, ApprovalQuery{Agent: agent, Name: d.Name, Port: port, Kind: kind, Refusal: d})
	if !out.Allowed || current == nil {
		return out
	}
	var now Decision
	if pol := current(); port == 0 {
		now = pol.DecideName(d.Name)
	} else {
		now = pol.Decide(d.Name, port)
	}
	if now.Allowed || !now.Askable {
		return now
	}
	return out
}

// askable reports whether a denial of name on port is one ask mode asks
// about: no entry matched, rather than something refusing it; never DNS
// over TLS, a side door only an operator's entry opens; and never a name
// whose requests entries judge, which an approval of the whole name would
// carry past them.
func (p *Policy) askable(d Decision, name string, port uint16) bool {
	return p != nil && p.ask && !d.Allowed && port != dotPort &&
		(d.Reason == ReasonNoRule || d.Reason == ReasonPortNotListed) && !p.needsRequests(name, port)
}

// ParseModeWithAsk parses a mode as ParseMode does, and "ask", which is
// an allowlist in ask mode (Config.Ask).
func ParseModeWithAsk(s string) (Mode, bool, error) {
	if strings.EqualFold(strings.TrimSpace(s), "ask") { // not a name: a mode
		return Allowlist, true, nil
	}
	m, err := ParseMode(s)
	return m, false, err
}
