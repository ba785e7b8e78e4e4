//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
)

// captureStdout runs f and returns what it printed on stdout.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	f()
	os.Stdout = old
	w.Close()
	return <-done
}

// fakeAdmin serves a minimal admin API on a unix socket and returns its
// path and how many requests it served.
func fakeAdmin(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	seen := new(atomic.Int32)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/agents":
			json.NewEncoder(w).Encode([]AgentInfo{{Name: "alice", UID: 200000}})
		case r.Method == "GET":
			w.Write([]byte("{}"))
		case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/secrets"):
			w.Write([]byte(`{"placeholder":"agenthold-placeholder-1"}`))
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path, seen
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, c := range commands {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			var code int
			out := captureStdout(t, func() { code = run(append(strings.Fields(c.name), "--help")) })
			assert.Equal(t, exitOK, code)
			assert.Contains(t, out, "Usage: agenthold "+c.name)
			assert.Contains(t, out, "Flags:")
		})
	}
	out := captureStdout(t, func() { run([]string{"secret", "put", "--help"}) })
	assert.Contains(t, out, `--template 'Bearer {{.Value}}'`, "the template syntax is shown with an example")
	out = captureStdout(t, func() { run([]string{"help"}) })
	for _, c := range commands {
		assert.Contains(t, out, "  "+c.name+" ", "help lists %s", c.name)
	}
	// help COMMAND is COMMAND --help; help of no command is a usage error.
	for _, c := range commands {
		var code int
		viaHelp := captureStdout(t, func() { code = run(append([]string{"help"}, strings.Fields(c.name)...)) })
		assert.Equal(t, exitOK, code, "help %s", c.name)
		assert.Equal(t, captureStdout(t, func() { run(append(strings.Fields(c.name), "--help")) }), viaHelp, "help %s", c.name)
	}
	var code int
	captureStdout(t, func() { code = run([]string{"help", "bogus"}) })
	assert.Equal(t, exitUsage, code, "help bogus")
}

// TestExecWithoutDashDash: a command's own flags given without "--" are
// not read as exec's; the error says where "--" goes.
func TestExecWithoutDashDash(t *testing.T) {
	for _, args := range [][]string{{"exec", "carol", "curl", "-sI", "https://example.com"}, {"exec", "carol", "ls"}} {
		err := dispatch(args)
		var ue usageError
		require.ErrorAs(t, err, &ue, "%v", args)
		assert.ErrorContains(t, err, "exec needs -- before the command: agenthold exec carol -- "+strings.Join(args[2:], " "))
	}
	assert.ErrorIs(t, dispatch([]string{"exec", "--help"}), errHelpShown)
}

// TestGlobalSocketAnywhere takes --socket before the command, between its
// words and after its arguments.
func TestGlobalSocketAnywhere(t *testing.T) {
	socket, seen := fakeAdmin(t)
	for _, args := range [][]string{
		{"--socket", socket, "agent", "list"},
		{"agent", "--socket=" + socket, "list"},
		{"agent", "list", "--socket", socket},
		{"policy", "show", "alice", "-socket", socket},
	} {
		var code int
		captureStdout(t, func() { code = run(args) })
		assert.Equal(t, exitOK, code, "agenthold %v", args)
	}
	assert.EqualValues(t, 4, seen.Load())
	// After "--", the words are exec's command's, not ours.
	env, rest, err := globalFlags([]string{"exec", "a", "--", "tool", "--socket", "x"})
	require.NoError(t, err)
	assert.Empty(t, env.socket)
	assert.Equal(t, []string{"exec", "a", "--", "tool", "--socket", "x"}, rest)
}

// TestStateChangesSayWhatChanged checks that each command that changes the
// server's state prints one line saying what changed.
func TestStateChangesSayWhatChanged(t *testing.T) {
	socket, _ := fakeAdmin(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "delete", "alice"}, "agent alice deleted"},
		{[]string{"policy", "set", "alice", "--allow", "github.com"}, "agent alice: policy now allowlist github.com"},
		{[]string{"secret", "delete", "gh"}, "secret gh deleted"},
		{[]string{"secret", "attach", "alice", "gh", "--env", "GH"}, "alice: $GH now holds agenthold-placeholder-1, the placeholder for gh"},
		{[]string{"secret", "detach", "alice", "gh"}, "alice: secret gh detached"},
	} {
		var code int
		out := captureStdout(t, func() { code = run(append(tt.args, "--socket", socket)) })
		assert.Equal(t, exitOK, code, "%v", tt.args)
		assert.Equal(t, 1, strings.Count(out, "\n"), "%v printed %q", tt.args, out)
		assert.Contains(t, out, tt.want)
	}
}

// TestLogTableShowsUpstreamFailures shows why an allowed query got no
// answer, not only why a denied one was refused.
func TestLogTableShowsUpstreamFailures(t *testing.T) {
	servfail := egresslog.Record{Agent: "a", Kind: egresslog.KindDNS, Host: "slow.example", Method: "A", Allowed: true,
		Status: dns.RcodeServerFailure, Reason: "upstream failed: i/o timeout"}
	assert.Contains(t, logRow(servfail), "upstream failed: i/o timeout")
	ok := egresslog.Record{Agent: "a", Kind: egresslog.KindDNS, Host: "example.com", Method: "AAAA", Allowed: true, Reason: "allowed by rule"}
	assert.NotContains(t, logRow(ok), "allowed by rule", "a plain answer needs no reason")
	denied := egresslog.Record{Agent: "a", Kind: egresslog.KindDNS, Host: "evil.example", Method: "A", Status: dns.RcodeNameError, Reason: "no allow entry matches the host"}
	assert.Contains(t, logRow(denied), "no allow entry matches the host")
}

// TestPolicySetCommandRoundTrip: the `policy set` line a suggestion
// prints sets exactly the policy it stands for.
func TestPolicySetCommandRoundTrip(t *testing.T) {
	want := PolicySpec{Mode: "allowlist", Allow: []string{"github.com", "*.npmjs.org", "ssh.example.net:22", "!pastebin.com"}, AllowPrivateNetworks: true,
		Quotas: QuotaSpec{ConnectionsPerSecond: 50, DNSQueriesPerSecond: -1, BytesPerSecondUp: 1e6}}
	words := strings.Fields(policySetCommand("bob", want))
	require.Equal(t, []string{"agenthold", "policy", "set", "bob"}, words[:4])
	fs := flag.NewFlagSet("policy set", flag.ContinueOnError)
	got := policyFlags(fs, "open")
	var args []string
	for _, w := range words[4:] {
		args = append(args, strings.Trim(w, "'")) // the shell's quotes
	}
	require.NoError(t, fs.Parse(args))
	assert.Equal(t, want, got())
	assert.Equal(t, "allowlist github.com *.npmjs.org ssh.example.net:22 !pastebin.com +private connections/s=50 dns/s=-1 bytes-up/s=1e+06", policyText(want))
}

// TestPolicySetCommandIsShellSafe: a POSIX shell given the printed line
// passes each entry on as one argument, as it is, whatever quotes,
// semicolons or expansions an agent put into the name it asked for, and
// runs nothing else.
func TestPolicySetCommandIsShellSafe(t *testing.T) {
	entries := []string{"x';touch pwned;'.test", `x\'&touch${IFS}pwned&#.test`, "$(touch pwned).test", "`touch pwned`", "*.npmjs.org", "!pastebin.com"}
	cmd := policySetCommand("bob", PolicySpec{Mode: "allowlist", Allow: entries})
	dir := t.TempDir()
	sh := exec.Command("sh", "-c", `agenthold() { printf '%s\n' "$@"; }; `+cmd)
	sh.Dir = dir
	out, err := sh.Output()
	require.NoError(t, err, "%s", cmd)
	want := []string{"policy", "set", "bob", "--mode", "allowlist"}
	for _, e := range entries {
		want = append(want, "--allow", e)
	}
	assert.Equal(t, want, strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"))
	_, err = os.Stat(filepath.Join(dir, "pwned"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the line ran a command of its own")
}

// TestLogTableInStartOrder: a connection's record, made when it ends,
// is shown above the requests it carried, which started after it.
func TestLogTableInStartOrder(t *testing.T) {
	start := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	var in bytes.Buffer
	for _, r := range []egresslog.Record{
		{Time: start.Add(time.Millisecond), Agent: "a", Kind: egresslog.KindHTTP, Host: "api.example", Method: "GET", Path: "/request", Allowed: true, ConnID: 1},
		{Time: start, Agent: "a", Kind: egresslog.KindTLS, Host: "api.example", Port: 443, Allowed: true, ConnID: 1},
	} {
		in.Write(append(r.AppendJSON(nil), '\n'))
	}
	var out strings.Builder
	require.NoError(t, printLogTable(&out, &in, false))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	assert.Contains(t, lines[1], "tls", "the connection first")
	assert.Contains(t, lines[2], "/request")
}
