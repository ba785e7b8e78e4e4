// Package nftrules installs the nftables rules that feed tproxy: the
// redirect of a sandbox's DNS and TCP to the gateway's ports, and the drop
// of everything else. It is Linux only (netlink through
// github.com/google/nftables), kept apart so that the proxies build on
// every OS.
//
// GatewayRules are for the gateway's own network namespace: traffic from
// agent-facing interfaces or source prefixes has its DNS redirected to the
// DNS port and every TCP connection not addressed to the gateway
// redirected to the transparent proxy; agents reach only the named local
// ports; anything the gateway would have to forward is dropped; a packet
// whose source address does not route back through the interface it came
// in on is dropped (no sandbox can speak as another). SidecarRules are for
// a sandbox's own namespace: every process's outbound TCP except one
// exempt uid's is redirected by destination port, DNS to the DNS port, and
// everything else leaving the namespace is dropped, replies to inbound
// flows aside (and never a packet of the exempt uid's flows from another
// uid).
//
// Both are one batch in a table of their own, replacing any table of the
// same name (a crashed run's), and Close removes it. If the process dies
// without Close, redirected traffic meets closed ports and nothing is
// forwarded: sandboxes lose the network and never gain it.
//
// Typical use (see the package's Example):
//
//	a1 := nftrules.Link{Interface: "veth-a1", Addrs: []netip.Addr{addr1}} // its only source
//	rules, err := nftrules.GatewayRules{Links: []nftrules.Link{a1}, DNSPort: 15053, ProxyPort: 15001, OpenPorts: []uint16{15002}}.Apply()
//	if err != nil { ... }
//	defer rules.Close()
//	rules.AddLink(nftrules.Link{Interface: "veth-a2", Addrs: []netip.Addr{addr2}}) // a new agent
//
// nftrules does not proxy anything (tproxy does) and never touches a table
// it did not name.
package nftrules
