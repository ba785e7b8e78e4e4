//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/vault"
)

// TestSandboxCannotReadASecretsSourceFile: a secret whose value the
// gateway reads from a file (--source-file, "a mounted Kubernetes
// Secret", whose files are 0644 by default) lies in the host's tree,
// which the sandbox sees read-only. A file others may read is refused
// when put; one only the gateway may read stays closed to the sandbox,
// whose environment holds only the placeholder.
func TestSandboxCannotReadASecretsSourceFile(t *testing.T) {
	w := requireWorld(t)
	dir, err := os.MkdirTemp("/var/lib", "agenthold-src-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	const value = "ghp_sourcefilevalue0123456789abcdef"
	src := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(src, []byte(value+"\n"), 0o600))
	require.NoError(t, os.Chmod(src, 0o644)) // a Secret volume's defaultMode
	var out strings.Builder
	err = w.cli(&out, "secret", "put", "fromfile", "--host", "www.example.com", "--header", "X-Token", "--source-file", src)
	require.Error(t, err, "a source file others may read was taken")
	assert.Contains(t, out.String()+err.Error(), "readable by others")

	require.NoError(t, os.Chmod(src, 0o600))
	require.NoError(t, w.cli(io.Discard, "secret", "put", "fromfile", "--host", "www.example.com", "--header", "X-Token", "--source-file", src))
	t.Cleanup(func() { w.cli(io.Discard, "secret", "delete", "fromfile") })
	require.NoError(t, w.cli(io.Discard, "secret", "attach", "bob", "fromfile", "--env", "SRC_TOKEN"))
	got, err := w.inSandbox("bob", `echo "env: $SRC_TOKEN"; cat `+src+` 2>/dev/null || echo blocked`)
	require.NoError(t, err, got)
	assert.Contains(t, got, "env: agenthold-placeholder-", "the environment holds the placeholder")
	assert.Contains(t, got, "blocked")
	assert.NotContains(t, got, value, "the sandbox read the secret's value from its source file")
}

// TestSandboxGetsNoHostDirectoryThroughStdio: a directory on the
// operator's stdio (`agenthold exec ... < DIR`) would be a handle in the
// host's mount namespace, through which the sandbox walks the host's
// tree past every mount exec made (the private /tmp, the host's /proc,
// the read-only root) and writes to it. exec refuses it.
func TestSandboxGetsNoHostDirectoryThroughStdio(t *testing.T) {
	w := requireWorld(t)
	shared, err := os.MkdirTemp("/var/lib", "agenthold-stdin-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(shared) })
	require.NoError(t, os.Chmod(shared, 0o1777))
	root, err := os.Open("/")
	require.NoError(t, err)
	defer root.Close()

	pid := w.server.Process.Pid
	script := fmt.Sprintf(`cd /proc/self/fd/0 || exit 0
ls -d %s 2>/dev/null && echo "reached the host's /tmp"
touch %s/planted 2>/dev/null && echo "wrote to the host"
grep -q local_address proc/%d/net/tcp 2>/dev/null && echo "read the gateway's sockets"
true`, strings.TrimPrefix(w.dir, "/"), strings.TrimPrefix(shared, "/"), pid)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.self, "exec", "bob", "--", "sh", "-c", script)
	cmd.Env, cmd.Stdin = w.env(), root
	out, err := cmd.CombinedOutput()
	assert.Error(t, err, "exec ran with a directory as its input: %s", out)
	assert.Contains(t, string(out), "standard input is neither")
	for _, escape := range []string{"reached the host's /tmp", "wrote to the host", "read the gateway's sockets"} {
		assert.NotContains(t, string(out), escape)
	}
	_, err = os.Stat(filepath.Join(shared, "planted"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the sandbox wrote to the host's tree")
}

// TestExecHidesEveryGatewaySecretFile: every file of the gateway's that
// a sandbox must not read, wherever the configuration puts it outside
// the data directory, is covered in the sandbox's view of the host: the
// admin socket, the master key, the egress log and the approvals
// webhook's HMAC key (with which a sandbox could pass for the gateway
// to the control plane, or sign an answer approving its own request).
func TestExecHidesEveryGatewaySecretFile(t *testing.T) {
	key, err := vault.NewKey()
	require.NoError(t, err)
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{PlaceholderPrefix: "agenthold"})
	require.NoError(t, err)
	var cfg Config
	cfg.DataDir = t.TempDir()
	cfg.AdminSocket, cfg.Secrets.MasterKeyFile = "/run/agenthold/admin.sock", "/etc/agenthold/master.key"
	cfg.Egress.LogFile, cfg.Egress.Approvals.WebhookSecretFile = "/var/log/agenthold/egress.jsonl", "/etc/agenthold/webhook.key"
	s := &server{cfg: cfg, vault: v}
	a := &agent{spec: AgentSpec{Name: "bob"}, gw4: netip.MustParseAddr("198.18.0.1")}
	assert.ElementsMatch(t, []string{cfg.AdminSocket, cfg.Secrets.MasterKeyFile, cfg.Egress.LogFile, cfg.Egress.Approvals.WebhookSecretFile}, s.execInfo(a).Hide)
}

// TestWebhookKeyOthersCouldReadIsRefused: the approvals webhook's HMAC
// key must be readable by its owner only, as the master key: exec's cover
// over it lapses when the file is replaced (a Secret volume's update),
// and a sandbox sees the host's files.
func TestWebhookKeyOthersCouldReadIsRefused(t *testing.T) {
	key := filepath.Join(t.TempDir(), "webhook.key")
	require.NoError(t, os.WriteFile(key, []byte("0123456789abcdef0123"), 0o600))
	s := &server{}
	s.cfg.Egress.Approvals.WebhookURL, s.cfg.Egress.Approvals.WebhookSecretFile = "https://hooks.example.com/approve", key
	require.NoError(t, s.openApprovals())
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		require.NoError(t, os.Chmod(key, mode))
		assert.ErrorContains(t, s.openApprovals(), "readable by its owner only", "mode %v", mode)
	}
}
