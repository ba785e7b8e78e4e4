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

// A filtering DNS server in front of a real upstream (here a stub on
// loopback): an allowed name is answered, and the gateway remembers which
// name each address came from, for judging connections to it later.
func ExampleServer_upstream() {
	upstream := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		if r.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 140.82.112.3")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	upPC, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	up := &dns.Server{PacketConn: upPC, Handler: upstream}
	go up.ActivateAndServe()
	defer up.Shutdown()

	pol, _ := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"github.com"}})
	srv := &dnsfilter.Server{
		Agents:    func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-1", pol, src.IsLoopback() },
		Upstreams: []string{upPC.LocalAddr().String()},
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(pc, nil)
	defer srv.Close()

	m := new(dns.Msg).SetQuestion("github.com.", dns.TypeA)
	resp, err := dns.Exchange(m, pc.LocalAddr().String())
	if err != nil {
		panic(err)
	}
	fmt.Println(dns.RcodeToString[resp.Rcode], resp.Answer[0].(*dns.A).A)
	fmt.Println(srv.Names("agent-1", netip.MustParseAddr("140.82.112.3")))
	// Output:
	// NOERROR 140.82.112.3
	// [github.com]
}
