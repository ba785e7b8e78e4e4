package tproxy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/agenthold/egress/netguard"
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

// An allowed CONNECT: the proxy resolves the name on the gateway, checks
// the address at dial time (the test server on loopback is declared
// public here, as an operator declares an internal mirror), and tunnels.
func ExampleProxy_ServeExplicit_allowed() {
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			fmt.Fprintf(c, "mirror got %s", line)
			c.Close()
		}
	}()
	guard, _ := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	pol, _ := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"mirror.internal:*"}})
	p := &tproxy.Proxy{
		Agents:   func(src netip.Addr) (string, *policy.Policy, bool) { return "agent-1", pol, src.IsLoopback() },
		Guard:    guard,
		Resolver: names{"mirror.internal": netip.MustParseAddr("127.0.0.1")},
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
	_, port, _ := net.SplitHostPort(backend.Addr().String())
	fmt.Fprintf(c, "CONNECT mirror.internal:%s HTTP/1.1\r\nHost: mirror.internal:%s\r\n\r\n", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status)
	fmt.Fprintf(c, "hello\n")
	line, _ := br.ReadString('\n')
	fmt.Print(line)
	// Output:
	// 200 Connection established
	// mirror got hello
}

// names is a fixed resolver, standing in for the gateway's DNS.
type names map[string]netip.Addr

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
