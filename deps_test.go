package egress_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const module = "github.com/agenthold/egress"

// allowedDeps lists, for each building block, the module-external and
// in-module imports it may have beyond the standard library and
// golang.org/x. The leaves import nothing else.
var allowedDeps = map[string][]string{
	"netguard":  {module + "/internal/prefixmap"},
	"egresslog": nil,
	// OTLP export with OpenTelemetry's SDK: apart, so that no other user
	// of egresslog links it.
	"egresslog/otlp": {module + "/egresslog", "go.opentelemetry.io", "google.golang.org", "github.com/cenkalti/backoff",
		"github.com/cespare/xxhash", "github.com/go-logr", "github.com/google/uuid", "github.com/grpc-ecosystem/grpc-gateway"},
	"vault": {module + "/internal/hostname", module + "/internal/redact", module + "/internal/budget"},
	// AWS's own SigV4 signer for vault's AWSSigV4 mode: apart, so that
	// no other user of vault links the AWS SDK.
	"vault/awssig": {module + "/vault", "github.com/aws/aws-sdk-go-v2", "github.com/aws/smithy-go"},
	"policy":       {module + "/netguard", module + "/internal/hostname"},
	// Reading and watching policy files: apart, so that matching links
	// neither YAML nor a file watcher.
	"policy/policyfile": {module + "/policy", "github.com/fsnotify/fsnotify", "go.yaml.in/yaml/v3"},
	// Egress records as policy observations, for suggestions: where the
	// log and the policy meet, so that neither imports the other.
	"policy/learn": {module + "/policy", module + "/egresslog"},
	// Holding what ask mode asks about, until a person or a webhook
	// answers.
	"policy/approval": {module + "/policy", module + "/egresslog"},
	// Shared plumbing: what two building blocks need, with one owner.
	"internal/hostname":  nil,
	"internal/prefixmap": nil,
	"internal/httpmeter": nil,
	"internal/httpfwd":   {module + "/netguard"},
	"internal/redact":    nil,
	"internal/budget":    nil,
	"internal/fairlru":   nil,
	"dnsfilter":          {module + "/netguard", module + "/policy", module + "/egresslog", module + "/internal/budget", module + "/internal/fairlru", "github.com/miekg/dns"},
	"tproxy":             {module + "/netguard", module + "/policy", module + "/egresslog", module + "/internal/budget", module + "/internal/httpmeter", module + "/internal/httpfwd"},
	// The redirect rules: a leaf of their own, Linux only.
	"tproxy/nftrules": {"github.com/google/nftables", "github.com/mdlayher/netlink", "github.com/mdlayher/socket", "github.com/josharian/native"},
	// The kernel path (a BPF sockmap): apart, Linux only, so that only its
	// users link cilium/ebpf.
	"tproxy/fastpath": {"github.com/cilium/ebpf"},
	"mitm":            {module + "/netguard", module + "/policy", module + "/egresslog", module + "/internal/budget", module + "/internal/fairlru", module + "/internal/httpmeter", module + "/internal/httpfwd", module + "/internal/redact"},
}

// TestDependencyGraph keeps the packages independent: each imports only
// what the graph above allows, and none imports an example.
func TestDependencyGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "./...").Output()
	require.NoError(t, err, "go list")
	present := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		present[strings.TrimPrefix(p, module+"/")] = true
	}
	for pkg := range allowedDeps {
		if !assert.True(t, present[pkg], "%s is listed in the graph but is not in the module", pkg) {
			continue
		}
		t.Run(pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./"+pkg).Output()
			require.NoError(t, err, "go list -deps")
			allowed := closure(pkg)
			for _, dep := range strings.Fields(string(out)) {
				ok := dep == module+"/"+pkg || strings.HasPrefix(dep, "golang.org/x/") || allowedPrefix(dep, allowed)
				assert.True(t, ok, "%s imports %s, which the graph does not allow", pkg, dep)
			}
		})
	}
}

// closure adds to a package's allowed imports those of the in-module
// packages it may import, since their imports come with them.
func closure(pkg string) []string {
	seen := map[string]bool{}
	var out []string
	var walk func(string)
	walk = func(p string) {
		for _, dep := range allowedDeps[p] {
			if seen[dep] {
				continue
			}
			seen[dep] = true
			out = append(out, dep)
			if inner, ok := strings.CutPrefix(dep, module+"/"); ok {
				walk(inner)
			}
		}
	}
	walk(pkg)
	return out
}

func allowedPrefix(dep string, allowed []string) bool {
	for _, a := range allowed {
		if dep == a || strings.HasPrefix(dep, a+"/") {
			return true
		}
	}
	return false
}

// TestInternalComposesNothing: internal/ is one floor of leaf helpers
// the blocks share; what composes the blocks is the blocks' public API or
// the programs'. So no internal package imports a block that judges
// traffic, and no example program (what a user copies) imports internal/.
func TestInternalComposesNothing(t *testing.T) {
	blocks := []string{"/policy", "/dnsfilter", "/tproxy", "/mitm"}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./internal/...").Output()
	require.NoError(t, err, "go list")
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		for _, imp := range strings.Fields(imports) {
			for _, b := range blocks {
				assert.False(t, imp == module+b || strings.HasPrefix(imp, module+b+"/"), "%s imports %s", pkg, imp)
			}
		}
	}
	out, err = exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./examples/...").Output()
	require.NoError(t, err, "go list")
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		assert.NotContains(t, imports, module+"/internal/", "%s (an example a user copies) imports internal/", pkg)
	}
}
