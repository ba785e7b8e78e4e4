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
// The modes are Allowlist (the zero Mode, as in a file without one), Open
// (any public destination) and DenyAll. The zero Config, the zero Decision
// and a nil *Policy all deny. A Decision names the canonical name or the
// address it judged, which is what the caller must dial. Report mode
// decides as enforcement would but allows, marking what it would deny.
//
// A policy file is fail-closed at every step ([Load], [Watch]): absent,
// empty, unparseable or invalid denies everything; enforce: false denies
// everything; a watched file that goes bad after a good load denies
// everything rather than keeping the old policy.
//
// Typical use (ExampleWatch runs it):
//
//	w, err := policy.Watch("/etc/egress/policy.yaml", policy.WatchConfig{Logger: log})
//	...
//	d := w.Policy().Decide("api.github.com", 443)
//	if !d.Allowed {
//		log.Info("denied", "rule", d.Rule, "reason", d.Reason)
//	}
//
// policy does not classify addresses into public, private and never tiers
// (netguard does, at dial time): "*" and Open mean public destinations only
// because the dial refuses the rest, and AllowPrivateNetworks is carried
// for the dialler to apply.
package policy
