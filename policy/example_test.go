package policy_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/agenthold/egress/policy"
)

func ExampleNew() {
	p, err := policy.New(policy.Config{
		Mode:  policy.Allowlist,
		Allow: []string{"github.com", "github.com:22", "*.npmjs.org", "203.0.113.0/24:443"},
	})
	if err != nil {
		panic(err)
	}
	for _, q := range []struct {
		host string
		port uint16
	}{{"github.com", 443}, {"github.com", 22}, {"registry.npmjs.org", 443}, {"npmjs.org", 443}, {"203.0.113.9", 443}, {"evil.example", 443}} {
		d := p.Decide(q.host, q.port)
		fmt.Printf("%s:%d allowed=%v rule=%q reason=%q\n", q.host, q.port, d.Allowed, d.Rule, d.Reason)
	}
	// Output:
	// github.com:443 allowed=true rule="github.com" reason="allowed by rule"
	// github.com:22 allowed=true rule="github.com:22" reason="allowed by rule"
	// registry.npmjs.org:443 allowed=true rule="*.npmjs.org" reason="allowed by rule"
	// npmjs.org:443 allowed=false rule="" reason="no allow entry matches the host"
	// 203.0.113.9:443 allowed=true rule="203.0.113.0/24:443" reason="allowed by rule"
	// evil.example:443 allowed=false rule="" reason="no allow entry matches the host"
}

func ExampleParse() {
	p, err := policy.Parse([]byte(`
enforce: true
allowOut: ["*"]
`))
	fmt.Println(p.Decide("example.com", 5432).Allowed, err)

	p, err = policy.Parse([]byte("enforce: false\nmode: open\n"))
	fmt.Println(p.Decide("example.com", 443).Allowed, p.DenyReason(), err)

	p, err = policy.Parse([]byte("enforce: true\nallowOut: [github.com]\nalow: []\n"))
	fmt.Println(p.Decide("github.com", 443).Allowed, p.DenyReason(), err != nil)
	// Output:
	// true <nil>
	// false policy enforce is false <nil>
	// false policy file invalid true
}

// A watched policy file: edits apply as they land, and an edit that
// breaks the file denies everything until it is fixed (fail closed).
func ExampleWatch() {
	dir, err := os.MkdirTemp("", "policy-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "policy.yaml")
	write := func(content string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			panic(err)
		}
		if err := os.Rename(tmp, path); err != nil { // an atomic replace, as a control plane writes
			panic(err)
		}
	}
	write("enforce: true\nallow: [github.com]\n")

	loads := make(chan struct{}, 8)
	w, err := policy.Watch(path, policy.WatchConfig{OnLoad: func(*policy.Policy, error) { loads <- struct{}{} }})
	if err != nil {
		panic(err)
	}
	defer w.Close()
	<-loads // the first load
	show := func() {
		fmt.Println("github.com:", w.Policy().Decide("github.com", 443).Allowed, "| pypi.org:", w.Policy().Decide("pypi.org", 443).Allowed)
	}
	show()
	write("enforce: true\nallow: [github.com, pypi.org]\n")
	<-loads
	show()
	write("enforce: true\nallow: [github.com, pypi.org\n") // a broken edit
	<-loads
	show()
	// Output:
	// github.com: true | pypi.org: false
	// github.com: true | pypi.org: true
	// github.com: false | pypi.org: false
}
