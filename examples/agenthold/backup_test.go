//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/vault"
)

// backupSource is a gateway's state: an agent, a secret attached to it,
// the CA and the audit key.
func backupSource(t *testing.T) *server {
	cfg := defaultConfig()
	cfg.DataDir = t.TempDir()
	s := &server{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	require.NoError(t, s.openVault())
	require.NoError(t, s.openCA())
	_, err := loadAuditKey(s.auditKeyPath())
	require.NoError(t, err)
	require.NoError(t, s.vault.Set(vault.Secret{Name: "gh", Rule: vault.Rule{Hosts: []string{"api.github.com"}, Header: "Authorization", Template: "Bearer {{.Value}}"}}, []byte("ghp_backed_up")))
	_, err = s.vault.Attach("alice", "gh", "GH_TOKEN")
	require.NoError(t, err)
	specs, _ := json.Marshal([]AgentSpec{{Name: "alice", Policy: PolicySpec{Mode: "allowlist", Allow: []string{"api.github.com"}}, Index: 1}})
	require.NoError(t, os.WriteFile(filepath.Join(cfg.DataDir, "agents.json"), specs, 0o600))
	return s
}

func takeBackup(t *testing.T, s *server, passphrase string) []byte {
	body, _ := json.Marshal(map[string]string{"passphrase": passphrase})
	rec := httptest.NewRecorder()
	s.serveBackup(rec, httptest.NewRequest("POST", "/v1/backup", bytes.NewReader(body)))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var reply backupReply
	require.NoError(t, json.NewDecoder(rec.Body).Decode(&reply))
	return reply.Backup
}

// restored opens the state restored into dir as the server would, and
// checks it is the source's: the agent, its secret (injected), the CA.
func checkRestored(t *testing.T, src *server, dir string) {
	cfg := defaultConfig()
	cfg.DataDir = dir
	s := &server{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	require.NoError(t, s.openVault(), "the restored vault opens")
	specs, err := newAgents(dir).load()
	require.NoError(t, err)
	require.Len(t, specs, 1)
	assert.Equal(t, "alice", specs[0].Name)
	att := s.vault.Attachments("alice")
	require.Len(t, att, 1)
	req := httptest.NewRequest("GET", "https://api.github.com/user", nil)
	req.Header.Set("Authorization", "Bearer "+att[0].Placeholder)
	_, err = s.vault.Inject("alice", req)
	require.NoError(t, err)
	assert.Equal(t, "Bearer ghp_backed_up", req.Header.Get("Authorization"))
	for _, name := range []string{"egress/ca.crt", "egress/ca.key", "audit.key"} {
		want, _ := os.ReadFile(filepath.Join(src.cfg.DataDir, name))
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err, name)
		assert.Equal(t, want, got, name)
	}
}

// TestBackupRestore: a backup under a passphrase restores onto a fresh
// machine (it carries the master key); one under the master key restores
// where that key is, and nowhere else.
func TestBackupRestore(t *testing.T) {
	src := backupSource(t)
	t.Run("passphrase", func(t *testing.T) {
		data := takeBackup(t, src, "correct horse battery staple")
		assert.NotContains(t, string(data), "ghp_backed_up")
		assert.NotContains(t, string(data), "PRIVATE KEY", "the CA's key in the clear")
		dir := filepath.Join(t.TempDir(), "data")
		assert.Error(t, restoreBackup(dir, filepath.Join(dir, "master.key"), data, []byte("wrong horse")), "a wrong passphrase")
		assert.Error(t, restoreBackup(dir, filepath.Join(dir, "master.key"), data, nil), "no passphrase")
		require.NoError(t, restoreBackup(dir, filepath.Join(dir, "master.key"), data, []byte("correct horse battery staple")))
		checkRestored(t, src, dir)
		err := restoreBackup(dir, filepath.Join(dir, "master.key"), data, []byte("correct horse battery staple"))
		assert.ErrorContains(t, err, "without state", "restored over a data directory with state")
	})
	t.Run("master key", func(t *testing.T) {
		data := takeBackup(t, src, "")
		dir := filepath.Join(t.TempDir(), "data")
		err := restoreBackup(dir, filepath.Join(dir, "master.key"), data, nil)
		assert.ErrorContains(t, err, "master key", "restored without the key it was made under")
		other, _ := vault.NewKey()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "master.key"), other, 0o600))
		assert.ErrorContains(t, restoreBackup(dir, filepath.Join(dir, "master.key"), data, nil), "another master key")
		key, err := os.ReadFile(src.cfg.masterKeyFile())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "master.key"), key, 0o600))
		require.NoError(t, restoreBackup(dir, filepath.Join(dir, "master.key"), data, nil))
		checkRestored(t, src, dir)
	})
}

// TestBackupTampering: a changed byte anywhere, a cut, or a header asking
// for an unbounded key derivation is refused, and nothing is restored.
func TestBackupTampering(t *testing.T) {
	src := backupSource(t)
	data := takeBackup(t, src, "pass")
	for i := range 3 {
		bad := bytes.Clone(data)
		switch i {
		case 0:
			bad[len(bad)-5] ^= 1
		case 1:
			bad = bad[:len(bad)/2]
		case 2:
			bad = bytes.Replace(bad, []byte(`"n":32768`), []byte(`"n":1073741824`), 1)
		}
		dir := filepath.Join(t.TempDir(), "data")
		assert.Error(t, restoreBackup(dir, filepath.Join(dir, "master.key"), bad, []byte("pass")), "case %d", i)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			assert.True(t, strings.HasSuffix(e.Name(), ".lock"), "case %d: %s restored from a bad backup", i, e.Name())
		}
	}
}

// TestBackupServesTheSameAfterRestore: a running gateway's backup (the
// CLI's, under a passphrase) restored onto a fresh data directory, where
// a new server serves the same agents, their placeholders and their
// injected secrets.
func TestBackupServesTheSameAfterRestore(t *testing.T) {
	w := requireWorld(t)
	data := filepath.Join(w.dir, "data")
	passFile := filepath.Join(t.TempDir(), "pass")
	require.NoError(t, os.WriteFile(passFile, []byte("a passphrase for the backup\n"), 0o600))
	backup := filepath.Join(t.TempDir(), "agenthold.backup")
	require.NoError(t, w.cli(io.Discard, "backup", backup, "--passphrase-file", passFile))
	envBefore, err := w.inSandbox("alice", "env")
	require.NoError(t, err)

	// The gateway stops (its namespaces and homes go with it), and its
	// data directory goes too: a new machine.
	require.NoError(t, w.server.Process.Signal(syscall.SIGTERM))
	w.server.Wait()
	require.NoError(t, os.Rename(data, data+".lost"))
	cfgPath := filepath.Join(w.dir, "agenthold.yaml")
	cmd := exec.Command(w.self, "restore", backup, "--config", cfgPath, "--passphrase-file", passFile)
	cmd.Env = w.env()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "restore: %s", out)
	require.NoError(t, w.startServer())

	var list strings.Builder
	require.NoError(t, w.cli(&list, "agent", "list"))
	assert.Contains(t, list.String(), "alice")
	assert.Contains(t, list.String(), "bob")
	envAfter, err := w.inSandbox("alice", "env")
	require.NoError(t, err)
	placeholder := regexp.MustCompile(`ANTHROPIC_API_KEY=\S+`)
	assert.Equal(t, placeholder.FindString(envBefore), placeholder.FindString(envAfter), "alice's placeholder")
	answer, err := w.inSandbox("alice", `curl -sS -N https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}'`)
	assert.NoError(t, err, "%s", answer)
	assert.Contains(t, answer, "message_stop", "alice's secret injected after the restore")
}
