package policyfile_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/policyfile"
)

func ExampleParse() {
	p, err := policyfile.Parse([]byte(`
enforce: true
allowOut: ["*"]
`))
	fmt.Println(p.Decide("example.com", 5432).Allowed, err)

	p, err = policyfile.Parse([]byte("enforce: false\nmode: open\n"))
	fmt.Println(p.Decide("example.com", 443).Allowed, p.DenyReason(), err)

	p, err = policyfile.Parse([]byte("enforce: true\nallowOut: [github.com]\nalow: []\n"))
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
	w, err := policyfile.Watch(path, policyfile.WatchConfig{OnLoad: func(*policy.Policy, error) { loads <- struct{}{} }})
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
