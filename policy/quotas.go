package policy

import (
	"context"
	"fmt"
	"math"
)

// Quotas bound what one agent may take of a gateway shared with others.
// A zero field means its default; a negative one, no limit. Exceeding a
// quota is refused quickly, recorded, and leaves other agents untouched.
type Quotas struct {
	// ConnectionsPerSecond bounds new connections (transparent, CONNECT
	// tunnels and explicit-proxy requests alike), with bursts of twice as
	// many.
	ConnectionsPerSecond float64 `yaml:"connectionsPerSecond" json:"connectionsPerSecond,omitempty"`
	// DNSQueriesPerSecond bounds DNS queries, with bursts of twice as
	// many.
	DNSQueriesPerSecond float64 `yaml:"dnsQueriesPerSecond" json:"dnsQueriesPerSecond,omitempty"`
	// BytesPerSecondUp and BytesPerSecondDown bound the bytes an agent's
	// connections move towards destinations and back, with bursts of a
	// second's worth. Zero means no limit.
	BytesPerSecondUp   float64 `yaml:"bytesPerSecondUp" json:"bytesPerSecondUp,omitempty"`
	BytesPerSecondDown float64 `yaml:"bytesPerSecondDown" json:"bytesPerSecondDown,omitempty"`
}

// Defaults of Quotas' zero fields: generous for a program, tight for a
// flood.
const (
	DefaultConnectionsPerSecond = 500
	DefaultDNSQueriesPerSecond  = 500
)

// withDefaults resolves zero fields; negative ones become zero (no
// limit).
func (q Quotas) withDefaults() Quotas {
	pick := func(v, def float64) float64 {
		switch {
		case v < 0:
			return 0
		case v == 0:
			return def
		}
		return v
	}
	return Quotas{
		ConnectionsPerSecond: pick(q.ConnectionsPerSecond, DefaultConnectionsPerSecond),
		DNSQueriesPerSecond:  pick(q.DNSQueriesPerSecond, DefaultDNSQueriesPerSecond),
		BytesPerSecondUp:     max(q.BytesPerSecondUp, 0),
		BytesPerSecondDown:   max(q.BytesPerSecondDown, 0),
	}
}

func (q Quotas) check() error {
	for name, v := range map[string]float64{
		"connectionsPerSecond": q.ConnectionsPerSecond, "dnsQueriesPerSecond": q.DNSQueriesPerSecond,
		"bytesPerSecondUp": q.BytesPerSecondUp, "bytesPerSecondDown": q.BytesPerSecondDown,
	} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("policy: quota %s: %v is not a number of a second", name, v)
		}
		if v > 0 && v < 1 && name != "bytesPerSecondUp" && name != "bytesPerSecondDown" {
			return fmt.Errorf("policy: quota %s: %v is less than one a second", name, v)
		}
	}
	return nil
}

// Quotas returns the policy's quotas, defaults resolved: a zero field
// means no limit. A nil policy has the defaults.
func (p *Policy) Quotas() Quotas {
	if p == nil {
		return Quotas{}.withDefaults()
	}
	return p.quotas
}

// Reasons recorded when an agent exceeds a quota; they share a prefix so
// that a metrics exporter can count them apart.
const (
	ReasonQuotaPrefix      = "quota exceeded: "
	ReasonQuotaConnections = ReasonQuotaPrefix + "new connections per second"
	ReasonQuotaDNS         = ReasonQuotaPrefix + "DNS queries per second"
	// ReasonQuotaMints is the gateway's own bound on the certificates one
	// agent's connections may have it mint, not one a policy sets.
	ReasonQuotaMints = ReasonQuotaPrefix + "certificates minted per second"
)

// QuotaReasons are every ReasonQuota constant.
func QuotaReasons() []string {
	return []string{ReasonQuotaConnections, ReasonQuotaDNS, ReasonQuotaMints}
}

// QuotaError is what a building block returns when an agent's request
// was refused for a quota, so that whoever records it can tell a refusal
// from a failure.
type QuotaError struct {
	Reason string // one of the ReasonQuota constants
}

func (e *QuotaError) Error() string { return e.Reason }

type agentKey struct{}

// WithAgent returns a context saying which agent the gateway's work on it
// is for, so that a shared resource further down (dnsfilter's lookups for
// the gateway's own dials) charges that agent's share.
func WithAgent(ctx context.Context, agent string) context.Context {
	return context.WithValue(ctx, agentKey{}, agent)
}

// AgentFrom returns the agent WithAgent put in ctx, or "".
func AgentFrom(ctx context.Context) string {
	a, _ := ctx.Value(agentKey{}).(string)
	return a
}
