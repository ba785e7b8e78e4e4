// Package netguard decides which addresses may ever be dialled, and guards
// every dial so that the decision holds at connect time.
//
// Every address falls into one of three tiers. Public addresses are
// globally reachable. Private addresses (RFC 1918, unique local IPv6,
// CGNAT) are reachable only when the caller allows private networks.
// Never addresses are never dialled: loopback, link-local, cloud metadata
// endpoints (including the public-looking ones), multicast, broadcast,
// every block of the IANA special-purpose registries that is not globally
// reachable, the operator's never prefixes and the gateway's own
// addresses. IPv4-mapped IPv6 is unmapped first, and IPv6 forms that embed
// an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible) are judged by the
// address inside as well.
//
// The check that matters runs when the socket connects, on the address
// actually being connected ([Guard.Control], a [net.Dialer] ControlContext
// hook), so a name that resolves to an allowed address at one moment and a
// denied one the next (DNS rebinding) cannot slip through.
//
// A [Dialer] resolves the name itself, drops what the Guard refuses, asks
// the caller's Check hook (a policy at dial time) about the rest, and
// races the attempts as Happy Eyeballs does, each bounded by its own
// timeout. [NewTransport] and [NewClient] put it under net/http, with no
// environment proxy and bounded timeouts: the SSRF-safe client a service
// uses for URLs others give it.
//
// Typical use (see the package's Examples):
//
//	client := netguard.NewClient(nil) // public destinations only
//	resp, err := client.Get(webhookURL)
//
//	g, err := netguard.New(netguard.Config{Public: mirrors})
//	d := &netguard.Dialer{Guard: g, AllowPrivate: pol.AllowPrivateNetworks()}
//	conn, err := d.DialContext(ctx, "tcp", "api.github.com:443")
//
// A Guard's own addresses ([Guard.FollowLocal], which keeps them equal to
// the host's as they change, or [Guard.SetOwn]) are never dialled: a
// gateway must not be a way to its own ports, those on an address it
// gained after it started included. A user who declares loopback public
// for a test (Config.Public) still meets this rule for the host's other
// addresses.
//
// [ParseLiteral] recognises hosts that are addresses in disguise
// ("2130706433", "0x7f000001", "127.1"), so that callers never mistake one
// for a name.
//
// netguard does not decide which names or ports an agent may reach: that is
// the policy package. It imports only the standard library.
package netguard
