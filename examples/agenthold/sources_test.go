//go:build linux

package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
)

// TestSecretSources: a secret read from a file (rotated underneath, then
// removed) and one printed by a command reach the upstream in place of
// the sandbox's placeholder; their values never reach the sandbox, the
// records or the server's log; a source gone past --max-stale refuses
// the request with its reason.
func TestSecretSources(t *testing.T) {
	w := requireWorld(t)
	dir := t.TempDir()
	tokenFile, cmdFile := filepath.Join(dir, "token"), filepath.Join(dir, "cmd-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("file-token-one\n"), 0o600))
	require.NoError(t, os.WriteFile(cmdFile, []byte("command-token-one"), 0o600))
	// Login mode: each is injected only where the sandbox sent its
	// placeholder, so that the records tell the two apart.
	rule := []string{"--host", "echo.example.com", "--header", "Authorization", "--template", "Bearer {{.Value}}", "--mode", "login", "--max-stale", "1s"}
	require.NoError(t, w.cli(io.Discard, append([]string{"secret", "put", "filetok", "--source-file", tokenFile}, rule...)...))
	require.NoError(t, w.cli(io.Discard, append([]string{"secret", "put", "cmdtok", "--source-command", "cat " + cmdFile, "--refresh", "1s"}, rule...)...))
	var out strings.Builder
	require.NoError(t, w.cli(&out, "secret", "attach", "alice", "filetok", "--env", "FILETOK"))
	require.NoError(t, w.cli(&out, "secret", "attach", "alice", "cmdtok", "--env", "CMDTOK"))

	// The echo service shows what it got; the gateway redacts the value
	// back to the placeholder, and the record names the secret injected.
	call := func(env string) (string, error) {
		return w.inSandbox("alice", `curl -sS --max-time 5 https://echo.example.com/`+env+` -H "Authorization: Bearer $`+env+`"`)
	}
	injected := func(env, secret string) {
		t.Helper()
		echo, err := call(env)
		require.NoError(t, err, "%s: %s", env, echo)
		assert.Regexp(t, regexp.MustCompile(`Authorization: Bearer agenthold-placeholder-\S+`), echo, "%s: the value came back unredacted, or nothing was injected", env)
		rec := w.lastRecord(t, "/"+env)
		assert.Equal(t, secret, rec.Secret, "%s: the record names no secret injected: %+v", env, rec)
	}
	injected("FILETOK", "filetok")
	injected("CMDTOK", "cmdtok")

	// Rotated underneath: a new file renamed over the old.
	require.NoError(t, os.WriteFile(tokenFile+".new", []byte("file-token-two"), 0o600))
	require.NoError(t, os.Rename(tokenFile+".new", tokenFile))
	require.NoError(t, os.WriteFile(cmdFile, []byte("command-token-two"), 0o600))
	time.Sleep(1100 * time.Millisecond) // past the file's look and the command's refresh
	injected("FILETOK", "filetok")
	injected("CMDTOK", "cmdtok")

	// Gone: the last value serves for --max-stale, then the request is
	// refused, and the reason says why.
	require.NoError(t, os.Remove(tokenFile))
	require.Eventually(t, func() bool {
		echo, _ := call("FILETOK")
		if !strings.Contains(echo, "could not be redacted") {
			return false
		}
		// The sandbox is told only that; the record says why.
		assert.NotContains(t, echo, "source")
		rec := w.lastRecord(t, "/FILETOK")
		return !rec.Allowed && strings.Contains(rec.Reason, "its source") && strings.Contains(rec.Reason, "no such file")
	}, 10*time.Second, 200*time.Millisecond, "a request with a source gone past --max-stale was not refused, with the reason in its record")

	logs, _ := os.ReadFile(filepath.Join(w.dir, "server.log"))
	records, _ := os.ReadFile(filepath.Join(w.dir, "egress.jsonl"))
	env, _ := w.inSandbox("alice", "env")
	for where, text := range map[string]string{"the server's log": string(logs), "the records": string(records), "the sandbox's environment": env} {
		for _, v := range []string{"file-token-one", "file-token-two", "command-token-one", "command-token-two"} {
			assert.False(t, strings.Contains(text, v), "a source's value is in %s", where)
		}
	}
}

// lastRecord is alice's newest HTTP record for a path.
func (w *world) lastRecord(t *testing.T, path string) egresslog.Record {
	t.Helper()
	var out strings.Builder
	require.NoError(t, w.cli(&out, "log", "--agent", "alice", "--kind", "http", "--json", "--limit", "0"))
	var found egresslog.Record
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if rec, err := egresslog.ParseJSON([]byte(line)); err == nil && rec.Path == path {
			found = rec
		}
	}
	require.NotZero(t, found.Seq, "no record of %s", path)
	return found
}
