// Command ssrfclient fetches URLs a third party chose (a webhook's) with
// netguard alone: loopback, private networks and cloud metadata are
// refused at connect time, whatever the URL's host resolves to.
package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/agenthold/egress/netguard"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "internal") }))
	client := netguard.NewClient(nil)
	for _, url := range []string{"http://" + ln.Addr().String() + "/", "http://169.254.169.254/latest/meta-data/"} {
		_, err := client.Get(url)
		fmt.Printf("%s refused: %v\n", url, errors.Is(err, netguard.ErrDenied))
	}
}
