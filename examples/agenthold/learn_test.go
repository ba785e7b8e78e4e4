//go:build linux

package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goClientEnv makes the test binary a Go HTTP client (net/http's default
// transport: the environment's proxy, the system's roots) that fetches
// the URL it names and prints the body.
const goClientEnv = "AGENTHOLD_TEST_GO_GET"

func goClientGet(url string) int {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	io.Copy(os.Stdout, resp.Body)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, resp.Status)
		return 1
	}
	return 0
}

// TestLearnAllowlist: an agent in report mode goes through a session of
// real clients (curl, git, a Go program); `policy suggest --apply` turns
// what it did into an allowlist; the same session then works again under
// that allowlist, and what the session did not do is refused.
func TestLearnAllowlist(t *testing.T) {
	w := requireWorld(t)
	// The Go client is this binary, in a directory the sandbox's user
	// can read.
	bin := goClientCopy(t)
	require.NoError(t, w.cli(io.Discard, "policy", "set", "alice", "--mode", "allowlist", "--report"))
	session := []struct{ what, script, want string }{
		{"curl with an injected key", `curl -sS -N https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}'`, "message_stop"},
		{"git clone with an injected token", `cd /tmp && rm -rf hello && git clone -q https://github.com/demo/hello.git hello && cat hello/README.md`, "cloned through agenthold"},
		{"a Go client", goClientEnv + `=https://registry.npmjs.org/left-pad ` + bin, `"served-by":"registry.npmjs.org"`},
		{"SSH, the server first", `bash -c 'exec 3<>/dev/tcp/ssh.example.net/22; head -1 <&3'`, "SSH-2.0"},
	}
	replay := func(phase string) {
		for _, step := range session {
			out, err := w.inSandbox("alice", step.script)
			require.NoError(t, err, "%s: %s: %s", phase, step.what, out)
			require.Contains(t, out, step.want, "%s: %s", phase, step.what)
		}
	}
	replay("report mode")
	out, err := w.inSandbox("alice", "curl -sS --max-time 5 https://www.example.com:8443/")
	require.Error(t, err, "a port nothing listens on answered: %s", out)

	var suggestion strings.Builder
	require.NoError(t, w.cli(&suggestion, "policy", "suggest", "alice", "--apply"))
	t.Logf("suggestion:\n%s", suggestion.String())
	assert.Contains(t, suggestion.String(), "only attempted, left out: www.example.com:8443", "what failed is reported apart")
	var pol PolicySpec
	require.NoError(t, (&cliEnv{socket: w.socket}).client().do("GET", agentPath("alice", "policy"), nil, &pol))
	assert.False(t, pol.Report, "the applied policy is still in report mode")
	assert.ElementsMatch(t, []string{"api.anthropic.com", "github.com", "registry.npmjs.org", "ssh.example.net:22"}, pol.Allow, "the learnt allowlist")

	replay("learnt allowlist")
	for _, script := range []string{
		"curl -fsS --max-time 5 https://evil.example.org/",
		"curl -fsS --max-time 5 https://echo.example.com/",
		"curl -fsS --max-time 5 http://www.example.com/",
		"curl -fsS --max-time 5 http://ssh.example.net/",
		"bash -c 'exec 3<>/dev/tcp/ssh.example.net/2222; head -1 <&3' | grep SSH-2.0",
	} {
		out, err := w.inSandbox("alice", script)
		assert.Error(t, err, "%s: outside the learnt allowlist, yet: %s", script, out)
	}
}

// goClientCopy copies the test binary where a sandbox's user can run it.
func goClientCopy(t *testing.T) string {
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("/var/lib", "agenthold-goclient-") // /tmp is the sandbox's own
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	path := filepath.Join(dir, "goclient")
	require.NoError(t, os.WriteFile(path, b, 0o755))
	return path
}

// TestNodeTrustsUpstreamRoots: Node.js reads NODE_EXTRA_CA_CERTS on top
// of its own roots, never the system bundle, so that file holds the
// gateway's CA and the extra upstream roots: a host passed through whose
// chain ends at one of those (the demo's internet) verifies.
func TestNodeTrustsUpstreamRoots(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("requires node")
	}
	w := requireWorld(t)
	script := `node -e "require('https').get('https://registry.npmjs.org/left-pad', r => { let b = ''; r.on('data', d => b += d); r.on('end', () => console.log(r.statusCode, b)) }).on('error', e => { console.error(e.message); process.exit(1) })"`
	for _, path := range []string{"", "unset HTTPS_PROXY HTTP_PROXY https_proxy http_proxy; "} {
		out, err := w.inSandbox("alice", path+script)
		require.NoError(t, err, "node https to a host passed through: %s", out)
		assert.Contains(t, out, `"served-by":"registry.npmjs.org"`)
	}
}
