package tproxy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
)

func ExampleProxy_ServeExplicit() {
	pol, _ := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"github.com"}})
	p := &tproxy.Proxy{
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-1", pol, src.IsLoopback() },
	}
	ln, err := tproxy.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go p.ServeExplicit(ln)
	defer p.Close()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT exfil.example:443 HTTP/1.1\r\nHost: exfil.example:443\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status)
	// Output: 403 Forbidden
}
