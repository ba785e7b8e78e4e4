// Package egress is the map of a library of egress building blocks for
// sandboxes that run untrusted code or AI agents: each sandbox reaches
// exactly the network its owner allows, by name and fail-closed, and uses
// credentials it can never read.
//
// Seven packages each do one job:
//
//   - netguard classifies every address (public, private, never) and guards
//     every dial at connect time. Leaf: standard library only.
//   - policy compiles allow entries into an immutable matcher and answers
//     "may this agent reach NAME or ADDR on PORT?" with a reason; it loads
//     and watches policy files, fail-closed at every step. Uses netguard.
//   - egresslog records every DNS query, connection and HTTP request per
//     agent, in bounded rings and in sinks. Leaf.
//   - dnsfilter is the sandboxes' DNS server: names the policy denies get
//     NXDOMAIN and are never forwarded; answers are filtered by netguard
//     and remembered per agent as address → name.
//   - tproxy is the transparent proxy and the explicit proxy: it decides by
//     SNI, Host or the remembered name, connects to what the name resolves
//     to on the gateway through netguard, splices bytes, and installs the
//     nftables rules that feed it.
//   - mitm terminates TLS for hosts that need a credential, with per-host
//     leaves from its own CA, and injects through an interface its caller
//     supplies.
//   - vault keeps secrets encrypted at rest and implements that injector:
//     the sandbox holds placeholders, never values. Leaf.
//
// Only the programs in examples/agenthold (a sandbox server's egress
// gateway) and examples/sidecar (a per-Pod egress filter) import them all.
// Every package fails closed: an absent, empty, unparseable, unknown or
// timed-out anything denies, with a reason a person can read.
package egress
