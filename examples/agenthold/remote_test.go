//go:build linux

package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRemoteAgent drives a remote agent from the fake internet's
// namespace, which has no redirect rules: with its token it reaches what
// its policy allows, through the gateway, with its secret injected in an
// intercepted tunnel; with a wrong token or none it gets 407; the local
// explicit port does not take its place, and exec refuses it.
func TestRemoteAgent(t *testing.T) {
	w := requireWorld(t)
	var out strings.Builder
	require.NoError(t, w.cli(&out, "agent", "create", "rita", "--remote", "--mode", "allowlist", "--allow", "www.example.com", "--allow", "api.anthropic.com", "--allow", "slow.example.com"))
	token := regexp.MustCompile(`only its hash\): (\S+)`).FindStringSubmatch(out.String())
	require.Len(t, token, 2, "no token in %q", out.String())
	assert.Contains(t, out.String(), "HTTPS_PROXY=https://rita:"+token[1]+"@"+gatewayUplink+":15443")
	out.Reset()
	require.NoError(t, w.cli(&out, "secret", "attach", "rita", "anthropic", "--env", "ANTHROPIC_API_KEY"))
	placeholder := regexp.MustCompile(`holds (\S+), the placeholder`).FindStringSubmatch(out.String())
	require.Len(t, placeholder, 2, "no placeholder in %q", out.String())
	ca := filepath.Join(w.dir, "gateway-ca.pem")
	caFile, err := os.Create(ca)
	require.NoError(t, err)
	require.NoError(t, w.cli(caFile, "ca"))
	caFile.Close()
	checkTrustFiles(t, w, ca)

	curl := func(proxy string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return w.inet.Run(ctx, "curl", append([]string{"-sS", "--connect-timeout", "3", "--max-time", "10", "-x", proxy, "--proxy-cacert", ca}, args...)...)
	}
	remote := "https://rita:" + token[1] + "@" + gatewayUplink + ":15443"
	body, err := curl(remote, "http://www.example.com/")
	require.NoError(t, err, "plain HTTP with the token: %s", body)
	assert.Contains(t, body, "Example Domain")
	body, err = curl(remote, "--cacert", ca, "-H", "x-api-key: "+placeholder[1], "https://api.anthropic.com/v1/models")
	require.NoError(t, err, "an intercepted tunnel with the token: %s", body)
	assert.Contains(t, body, "demo-model", "the secret was injected")
	body, err = curl(remote, "--fail-with-body", "http://evil.example.org/")
	assert.Error(t, err, "a host the policy does not allow")
	assert.Contains(t, body, "egress denied: no allow entry", "a host the policy does not allow")

	for name, proxy := range map[string]string{
		"a wrong token":               "https://rita:not-the-token@" + gatewayUplink + ":15443",
		"no token":                    "https://" + gatewayUplink + ":15443",
		"another agent's name":        "https://alice:" + token[1] + "@" + gatewayUplink + ":15443",
		"the token in the clear":      "http://rita:" + token[1] + "@" + gatewayUplink + ":15443",
		"the token on the local port": "http://rita:" + token[1] + "@" + gatewayUplink + ":15002",
	} {
		body, err := curl(proxy, "--proxytunnel", "https://api.anthropic.com/v1/models")
		require.Error(t, err, "%s: %s", name, body)
		if name != "the token on the local port" && name != "the token in the clear" { // neither reaches an answer
			assert.Contains(t, err.Error()+body, "407", name)
		}
	}
	assert.ErrorContains(t, w.cli(io.Discard, "exec", "rita", "--", "true"), "remote")

	// A Bearer token names its agent by itself.
	body, err = curl("https://"+gatewayUplink+":15443", "--proxy-header", "Proxy-Authorization: Bearer "+token[1], "http://www.example.com/")
	require.NoError(t, err, "Bearer: %s", body)
	assert.Contains(t, body, "Example Domain")
	// A sandbox that learnt the token gains nothing on its own port: it
	// stays itself (alice may not reach slow.example.com; rita may).
	alice := w.agentInfo(t, "alice")
	aliceOut, err := w.inSandbox("alice", "curl -sS --max-time 5 --fail-with-body -x http://rita:"+token[1]+"@"+alice.Gateway4+":15002 http://slow.example.com/")
	assert.Error(t, err, "a sandbox used a remote agent's token: %s", aliceOut)
	assert.Contains(t, aliceOut, "no allow entry")

	var records strings.Builder
	require.NoError(t, w.cli(&records, "log", "--agent", "rita", "--json", "--limit", "0"))
	assert.Contains(t, records.String(), `"host":"api.anthropic.com"`)
	assert.Contains(t, records.String(), `"secret":"anthropic"`)
	// Deleting the agent ends what it has open.
	tunnel := make(chan error, 1)
	go func() {
		_, err := curl(remote, "--proxytunnel", "--fail-with-body", "http://slow.example.com/")
		tunnel <- err
	}()
	time.Sleep(500 * time.Millisecond) // the tunnel is open, its answer 1.5 s away
	require.NoError(t, w.cli(io.Discard, "agent", "delete", "rita"))
	assert.Error(t, <-tunnel, "a deleted remote agent's tunnel lived on")
	body, err = curl(remote, "--fail-with-body", "http://www.example.com/")
	assert.Error(t, err, "a deleted remote agent's token still works: %s", body)
	serverLog, err := os.ReadFile(filepath.Join(w.dir, "server.log"))
	require.NoError(t, err)
	for _, line := range []string{"agent up", "secret attached", "agent deleted"} {
		assert.Regexp(t, `msg="`+line+`"[^\n]* agent=rita`, string(serverLog), "the server's log says nothing of the change")
	}
}

// checkTrustFiles: `agenthold ca --bundle` prints the bundle that ends
// with the CA, and the trust files are readable by any uid at
// DATA_DIR/trust (for a container runtime to mount), while the data
// directory cannot be listed and the CA's key cannot be read.
func checkTrustFiles(t *testing.T, w *world, caFile string) {
	var bundle strings.Builder
	require.NoError(t, w.cli(&bundle, "ca", "--bundle"))
	ca, err := os.ReadFile(caFile)
	require.NoError(t, err)
	assert.Contains(t, bundle.String(), strings.TrimSpace(string(ca)), "the bundle holds the CA")
	assert.Greater(t, strings.Count(bundle.String(), "BEGIN CERTIFICATE"), 1, "the bundle holds the system's roots too")
	data := filepath.Join(w.dir, "data")
	as := func(args ...string) (string, error) {
		out, err := exec.Command("setpriv", append([]string{"--reuid=4242", "--regid=4242", "--clear-groups"}, args...)...).CombinedOutput()
		return string(out), err
	}
	for name, want := range map[string]string{"ca.crt": string(ca), "bundle.pem": bundle.String()} {
		out, err := as("cat", filepath.Join(data, "trust", name))
		require.NoError(t, err, "uid 4242 reading trust/%s: %s", name, out)
		assert.Equal(t, want, out, "trust/%s", name)
	}
	out, err := as("ls", data)
	assert.Error(t, err, "uid 4242 listed the data directory: %s", out)
	out, err = as("cat", filepath.Join(data, "egress", "ca.key"))
	assert.Error(t, err, "uid 4242 read the CA's key: %s", out)
}
