// Package egress is the map of a library of egress building blocks for
// sandboxes that run untrusted code or AI agents: each sandbox reaches
// exactly the network its owner allows, by name and fail-closed, and uses
// credentials it can never read.
//
// Seven packages each do one job:
//
//   - netguard classifies every address (public, private, never) and guards
//     every dial at connect time. Leaf: standard library only (with the
//     module's internal address table).
//   - policy compiles allow entries into an immutable matcher and answers
//     "may this agent reach NAME or ADDR on PORT?" with a reason. Uses
//     netguard. policy/policyfile loads and watches policy files,
//     fail-closed at every step.
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
//     the sandbox holds placeholders, never values. Leaf; vault/awssig
//     adds AWS's own SigV4 signer for the AWS mode.
//
// # One place per guarantee
//
// Each guarantee is enforced in one place that every path must pass; a
// new protocol, header part or mode goes through it, never beside it.
//
//   - Who may send. In gateway mode an agent's interface accepts only
//     that agent's own addresses (and its link-local one) as source, in
//     the kernel: nftrules' agent_src chain, before any socket sees a
//     packet. Above it, the identity of a packet is its exact source
//     address, named by the AgentFunc each server is given: dnsfilter's
//     UDP door (udp.go) drops, and counts, any source it cannot name;
//     tproxy refuses a connection or request whose source it cannot name.
//   - What a name is. internal/hostname canonicalises a name once, where
//     it enters (a DNS question, SNI, Host, a CONNECT target, a policy
//     entry); nothing after it folds case or trims dots by hand (a test
//     greps the blocks for it).
//   - What is allowed. policy decides (Policy.Decide, DecideAddr,
//     DecidePort, DialCheck); each request is judged by the agent's policy
//     as policy.Current returns it then: tproxy judges the name a
//     connection carries (SNI, CONNECT target) with Decide, and a raw TCP
//     connection with one decision (judgeRaw, which always looks up the
//     name the agent resolved); every HTTP request, plain (tproxy) or
//     intercepted (mitm: HTTP/1.1, each HTTP/2 stream, WebSocket
//     upgrades), passes Policy.DecideHTTP, which judges its host, its
//     method and path under request entries, and an MCP endpoint's
//     JSON-RPC messages; dnsfilter judges every query; policy.DialCheck
//     every address at dial time. A host whose requests must be judged is
//     intercepted, and tproxy's relay, which every spliced path passes,
//     refuses it. A changed policy ends what it no longer allows (tproxy's
//     Rejudge).
//   - What the sandbox may see of a secret. mitm's redacting writer: in an
//     exchange that could carry a secret, everything the sandbox is sent
//     passes it; the upgrade to a WebSocket, which leaves HTTP, passes
//     the frame redactor.
//   - What is recorded. egresslog.Log's one entry point (Record): two
//     bounded rings (denials apart, so that allowed traffic and refusals
//     cannot evict them), refusals of a spent budget summarised per agent,
//     reason and second, and size-capped rotating files.
//   - What a byte costs. internal/budget: per-agent counters and rates
//     bound connections, queries, requests and bytes on every path.
//
// Only the programs in examples/agenthold (a sandbox server's egress
// gateway) and examples/sidecar (a per-Pod egress filter) import them all.
// Every package fails closed: an absent, empty, unparseable, unknown or
// timed-out anything denies, with a reason a person can read.
package egress
