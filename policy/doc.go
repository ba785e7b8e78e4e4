// Package policy decides whether an agent may reach a destination, by name
// or address and port, with a reason for every answer.
//
// A policy is compiled once from allow entries into an immutable matcher:
// exact names in a hash map, wildcards ("*.npmjs.org": subdomains only,
// never the apex) by walking the name's suffixes, and address prefixes in
// a table searched in logarithmic time, so the cost of a decision does not
// grow with the number of rules, and deciding allocates nothing. Names are
// normalised once (lower case, no trailing dot, IDNA A-labels), as secret
// rules normalise them; a host that is an IP literal in any spelling is
// judged as the address it is. An entry written as a URL is an error that
// says entries are host[:port].
//
// Deny entries ("!pastebin.com", "!*.ngrok.io", "!203.0.113.0/24", or a
// deny: list in a file) take the same forms and win over every allow
// entry and over Open mode, so "open except these" and "these wildcards
// except those hosts" are both expressible; the reason names the deny
// entry. DNS side doors are closed by default: port 853 (DNS over TLS)
// only by an entry that names it, and the well-known public
// DNS-over-HTTPS resolvers ([KnownDoHEndpoints], extended by a Config's
// DoHEndpoints) only by an entry naming the host or address exactly,
// whatever "*" or Open allow.
//
// Request entries allow or deny some requests to a host, by method and
// path: "GET,HEAD api.github.com/repos/acme/*" ("*" one segment, "**"
// any number), "github.com/acme/scratch.git/**" (every method),
// "!DELETE *.github.com/**". A host they name is allowed at the DNS, TLS
// and connection stages with Decision.Requests set, and each request on
// it is judged by DecideRequest, or DecideHTTP, which reads an MCP
// endpoint's messages too ("mcp https://mcp.example.com/mcp
// tools=search,fetch", or Config.MCP): tools/call by the tool's name,
// other methods by a list. DecideAgain judges by another policy, by the
// same code, what DecideHTTP read of a request, so that a policy change
// can end a request being forwarded (a stream, a long tool call) whose
// body has gone on. Paths are judged as a server reads them
// (parameters dropped, escapes decoded, dot segments resolved, an
// encoded slash never a boundary for an allow entry); what does not
// normalise cleanly is refused with its reason.
//
// In ask mode (Config.Ask, or mode: ask in a document) a name no entry
// allows, and nothing refuses outright, is askable (Decision.Askable):
// the blocks hand it to an Approver (Ask; package approval holds it until
// a person or a webhook answers) instead of refusing it.
//
// Address deny entries and the resolvers' addresses apply to the
// addresses an allowed name resolves to as well: [Policy.CheckResolved],
// at dial time (netguard's Check hook; [DialCheck] for a transport).
//
// [Suggest] proposes the smallest allowlist that covers what an agent
// did (typically in report mode), from its log: the names and ports it
// used, what it only attempted apart.
//
// The modes are Allowlist (the zero Mode, as in a file without one), Open
// (any public destination) and DenyAll. The zero Config, the zero Decision
// and a nil *Policy all deny. A Decision names the canonical name or the
// address it judged, which is what the caller must dial. Report mode
// decides as enforcement would but allows, marking what it would deny.
//
// A [Document] is a policy as a file holds it, its keys in camelCase;
// package policyfile reads (Parse, Load) and watches (Watch) one, fail
// closed at every step: absent, empty, unparseable, invalid or with an
// unknown key denies everything; enforce: false denies everything; a
// watched file that goes bad after a good load denies everything rather
// than keeping the old policy. Matching needs no YAML and no file
// watcher: this package imports only the standard library, golang.org/x
// and netguard.
//
// Typical use (ExampleNew runs it; policyfile's ExampleWatch a file):
//
//	p, err := policy.New(policy.Config{Allow: []string{"api.github.com", "*.npmjs.org"}})
//	...
//	d := p.Decide("api.github.com", 443)
//	if !d.Allowed {
//		log.Info("denied", "rule", d.Rule, "reason", d.Reason)
//	}
//
// policy does not classify addresses into public, private and never tiers
// (netguard does, at dial time): "*" and Open mean public destinations only
// because the dial refuses the rest, and AllowPrivateNetworks is carried
// for the dialler to apply.
package policy
