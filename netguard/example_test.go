package netguard_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/agenthold/egress/netguard"
)

func ExampleGuard_Classify() {
	var g netguard.Guard // the built-in classification
	for _, s := range []string{"140.82.112.3", "10.1.2.3", "169.254.169.254", "168.63.129.16", "64:ff9b::7f00:1"} {
		fmt.Println(s, "->", g.Classify(netip.MustParseAddr(s)).Tier)
	}
	// Output:
	// 140.82.112.3 -> public
	// 10.1.2.3 -> private
	// 169.254.169.254 -> never
	// 168.63.129.16 -> never
	// 64:ff9b::7f00:1 -> never
}

func ExampleParseLiteral() {
	for _, h := range []string{"0x7f000001", "127.1", "github.com", "1.2.3.256"} {
		a, err := netguard.ParseLiteral(h)
		switch {
		case err == nil:
			fmt.Println(h, "is the address", a)
		case errors.Is(err, netguard.ErrNotLiteral):
			fmt.Println(h, "is a name")
		default:
			fmt.Println(h, "is invalid")
		}
	}
	// Output:
	// 0x7f000001 is the address 127.0.0.1
	// 127.1 is the address 127.0.0.1
	// github.com is a name
	// 1.2.3.256 is invalid
}

func ExampleGuard_Control() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	var g netguard.Guard
	d := net.Dialer{ControlContext: g.Control(false)}
	_, err = d.DialContext(context.Background(), "tcp", ln.Addr().String())
	fmt.Println(errors.Is(err, netguard.ErrDenied))
	// Output: true
}
