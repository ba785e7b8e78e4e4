// Command goget is the e2e check's Go client: net/http's default
// transport (the environment's proxy, the system's roots), as a Go
// program in a sandbox would use it. It prints the body of a GET, then
// the protocol it spoke on standard error, and fails on any status but
// 200.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: goget URL")
		os.Exit(2)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	io.Copy(os.Stdout, resp.Body)
	fmt.Fprintln(os.Stderr, resp.Proto)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, resp.Status)
		os.Exit(1)
	}
}
