//go:build linux

package nftrules_test

import (
	"log"
	"net/netip"

	"github.com/agenthold/egress/tproxy/nftrules"
)

// Gateway mode, in the gateway's own network namespace (CAP_NET_ADMIN):
// each agent's interface admits only its agent's addresses as source;
// agents' DNS to the DNS port, their other TCP to the transparent proxy,
// the explicit proxy's port open to them, everything else dropped.
func ExampleGatewayRules() {
	rules, err := nftrules.GatewayRules{
		Links:   []nftrules.Link{{Interface: "veth-agent1", Addrs: []netip.Addr{netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("fd00:1::10")}}},
		DNSPort: 15053, ProxyPort: 15001, OpenPorts: []uint16{15002},
	}.Apply()
	if err != nil {
		log.Fatal(err)
	}
	defer rules.Close()
	agent2 := nftrules.Link{Interface: "veth-agent2", Addrs: []netip.Addr{netip.MustParseAddr("198.18.2.10")}}
	if err := rules.AddLink(agent2); err != nil { // a new agent, pinned to its address
		log.Fatal(err)
	}
}

// Sidecar mode, inside the sandbox's own namespace (an init container
// with CAP_NET_ADMIN): every process's TCP but the sidecar's own uid is
// redirected by port, DNS too; the table outlives the process.
func ExampleSidecarRules() {
	if _, err := (nftrules.SidecarRules{ExemptUID: nftrules.DefaultExemptUID}).Apply(); err != nil {
		log.Fatal(err)
	}
}
