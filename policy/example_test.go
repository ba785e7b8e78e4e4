package policy_test

import (
	"fmt"

	"github.com/agenthold/egress/policy"
)

func ExampleNew() {
	p, err := policy.New(policy.Config{
		Mode:  policy.Allowlist,
		Allow: []string{"github.com", "github.com:22", "*.npmjs.org", "203.0.113.0/24:443"},
	})
	if err != nil {
		panic(err)
	}
	for _, q := range []struct {
		host string
		port uint16
	}{{"github.com", 443}, {"github.com", 22}, {"registry.npmjs.org", 443}, {"npmjs.org", 443}, {"203.0.113.9", 443}, {"evil.example", 443}} {
		d := p.Decide(q.host, q.port)
		fmt.Printf("%s:%d allowed=%v rule=%q reason=%q\n", q.host, q.port, d.Allowed, d.Rule, d.Reason)
	}
	// Output:
	// github.com:443 allowed=true rule="github.com" reason="allowed by rule"
	// github.com:22 allowed=true rule="github.com:22" reason="allowed by rule"
	// registry.npmjs.org:443 allowed=true rule="*.npmjs.org" reason="allowed by rule"
	// npmjs.org:443 allowed=false rule="" reason="no allow entry matches the host"
	// 203.0.113.9:443 allowed=true rule="203.0.113.0/24:443" reason="allowed by rule"
	// evil.example:443 allowed=false rule="" reason="no allow entry matches the host"
}
