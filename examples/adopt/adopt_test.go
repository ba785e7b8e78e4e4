// Package adopt is a module outside the library's that imports each
// block alone, as a service adopting one would, and proves what that
// costs: the packages it links, the systems it builds for, and that it
// runs.
package adopt

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	module = "github.com/agenthold/egress"
	adopt  = module + "/examples/adopt" // this module: the programs
)

// programs: each imports one block (and what that block needs of the
// library), links nothing outside the standard library, golang.org/x and
// the third-party modules named, and prints what shows it worked.
var programs = []struct {
	dir     string
	blocks  []string // the library's packages it may link, internal/ aside
	modules []string // third-party modules it may link
	want    []string // lines of its output
}{
	{"ssrfclient", []string{"netguard"}, nil, []string{"refused: true", "169.254.169.254/latest/meta-data/ refused: true"}},
	{"matcher", []string{"policy", "netguard"}, nil, []string{
		`github.com allowed=true`, `registry.npmjs.org allowed=true`,
		`gist.github.com allowed=false`, `evil.example allowed=false`,
	}},
	{"dnsserver", []string{"dnsfilter", "policy", "netguard", "egresslog"}, []string{"github.com/miekg/dns"}, []string{"exfil.example: NXDOMAIN"}},
	{"connectproxy", []string{"tproxy", "policy", "netguard", "egresslog"}, nil, []string{"CONNECT exfil.example:443: 403 Forbidden"}},
	{"injection", []string{"vault"}, nil, []string{
		"api.openai.com real key: true used: [openai] err: <nil>",
		"exfil.example real key: false used: [] err: <nil>",
	}},
	{"leaves", []string{"mitm", "policy", "netguard", "egresslog"}, nil, []string{"api.github.com leaf verifies: true"}},
	{"jsonlog", []string{"egresslog"}, nil, []string{`"host":"api.github.com"`}},
}

func TestEachBlockAlone(t *testing.T) {
	for _, p := range programs {
		t.Run(p.dir, func(t *testing.T) {
			t.Parallel()
			dir := "./" + p.dir
			out := run(t, nil, "go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", dir)
			for _, dep := range strings.Fields(out) {
				if dep == adopt+"/"+p.dir {
					continue
				}
				assert.True(t, allowed(dep, p.blocks, p.modules), "%s links %s", p.dir, dep)
			}
			for _, goos := range []string{"linux", "darwin", "windows"} {
				run(t, []string{"GOOS=" + goos}, "go", "build", "-o", os.DevNull, dir)
				run(t, []string{"GOOS=" + goos}, "go", "vet", dir)
			}
			got := run(t, nil, "go", "run", dir)
			for _, w := range p.want {
				assert.Contains(t, got, w)
			}
		})
	}
}

// allowed reports whether a program for blocks may link dep.
func allowed(dep string, blocks, modules []string) bool {
	if strings.HasPrefix(dep, "golang.org/x/") {
		return true
	}
	if rest, ok := strings.CutPrefix(dep, module+"/"); ok {
		return strings.HasPrefix(rest, "internal/") || slices.Contains(blocks, rest)
	}
	for _, m := range modules {
		if dep == m || strings.HasPrefix(dep, m+"/") {
			return true
		}
	}
	return false
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s %v:\n%s", name, strings.Join(args, " "), env, out)
	return string(out)
}
