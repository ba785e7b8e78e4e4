// Command matcher judges destinations with policy alone: no file
// watcher, no YAML, no network.
package main

import (
	"fmt"
	"os"

	"github.com/agenthold/egress/policy"
)

func main() {
	p, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"github.com", "*.npmjs.org"}, Deny: []string{"gist.github.com"}})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	for _, host := range []string{"github.com", "registry.npmjs.org", "gist.github.com", "evil.example"} {
		d := p.Decide(host, 443)
		fmt.Printf("%s allowed=%v reason=%q\n", host, d.Allowed, d.Reason)
	}
}
