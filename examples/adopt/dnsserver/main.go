// Command dnsserver runs dnsfilter alone on loopback and asks it for a
// name its policy denies: NXDOMAIN, and the upstream is never asked.
package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/policy"
)

func main() {
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"github.com"}})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	srv := &dnsfilter.Server{
		Agents:    func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-1", pol, src.IsLoopback() },
		Upstreams: []string{"127.0.0.1:1"},
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	go srv.Serve(pc, nil)
	defer srv.Close()
	m := new(dns.Msg)
	m.SetQuestion("c2VjcmV0.exfil.example.", dns.TypeTXT)
	resp, err := dns.Exchange(m, pc.LocalAddr().String())
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("exfil.example:", dns.RcodeToString[resp.Rcode])
}
