// Command connectproxy runs tproxy's explicit (CONNECT) proxy alone on
// loopback and asks it for a host its policy denies.
package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
)

func main() {
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"github.com"}})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	p := &tproxy.Proxy{Agents: func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-1", pol, src.IsLoopback() }}
	ln, err := tproxy.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	go p.ServeExplicit(ln)
	defer p.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	defer c.Close()
	fmt.Fprint(c, "CONNECT exfil.example:443 HTTP/1.1\r\nHost: exfil.example:443\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("CONNECT exfil.example:443:", resp.Status)
}
