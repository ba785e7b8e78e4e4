package egress_test

import (
	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/vault"
)

// The seams between the building blocks are small interfaces, each
// declared by the package that consumes it. These assertions keep each
// implementation fitting its seam: a change to either side fails to
// compile here rather than in a program that composes them.
var (
	_ mitm.Injector      = (*vault.Vault)(nil)
	_ mitm.TokenStore    = (*vault.Vault)(nil)
	_ tproxy.Interceptor = (*mitm.Interceptor)(nil)
	_ netguard.Resolver  = (*dnsfilter.Server)(nil)
	_ tproxy.NamesFunc   = (*dnsfilter.Server)(nil).Names
)
