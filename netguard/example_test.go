package netguard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// A client for URLs an untrusted party chose (a webhook): it reaches the
// public internet only, whatever the URL's host says or resolves to, and
// through redirects too.
func ExampleNewClient() {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from an internal service")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	internal := "http://" + ln.Addr().String() + "/"

	client := netguard.NewClient(nil) // the built-in classification: loopback is never reached
	_, err = client.Get(internal)
	fmt.Println("webhook to loopback refused:", errors.Is(err, netguard.ErrDenied))

	// An operator may declare a prefix public (an internal mirror).
	mirror, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		panic(err)
	}
	resp, err := netguard.NewClient(&netguard.Dialer{Guard: mirror}).Get(internal)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(body))
	// Output:
	// webhook to loopback refused: true
	// hello from an internal service
}

// A caller's own policy at dial time: the Check hook sees the host as
// named and every address the Guard permits.
func ExampleDialer_check() {
	allowed := map[string]bool{"api.example.com": true}
	d := &netguard.Dialer{
		Check: func(_ context.Context, host string, addr netip.AddrPort) error {
			if !allowed[host] {
				return fmt.Errorf("%s is not on the allowlist", host)
			}
			return nil
		},
		Resolver: staticResolver{"evil.example.com": {netip.MustParseAddr("93.184.216.34")}},
	}
	_, err := d.DialContext(context.Background(), "tcp", "evil.example.com:443")
	fmt.Println(err)
	// Output: netguard: dial evil.example.com: evil.example.com is not on the allowlist
}

// staticResolver answers from a table, standing in for DNS.
type staticResolver map[string][]netip.Addr

func (r staticResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return r[host], nil
}
