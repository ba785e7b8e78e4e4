package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthold/egress/internal/netns"
)

// TestMain lets the test binary stand in for the agenthold binary: the
// demo world runs `agenthold serve`, `exec` and friends as
// os.Executable(), which in a test is this binary.
func TestMain(m *testing.M) {
	if os.Getenv("AGENTHOLD_TEST_AS_CLI") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestExampleConfigIsTheDefault(t *testing.T) {
	cfg, err := loadConfig("agenthold.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := defaultConfig(); fmt.Sprintf("%+v", cfg) != fmt.Sprintf("%+v", want) {
		t.Errorf("agenthold.example.yaml says\n%+v\nbut the defaults are\n%+v", cfg, want)
	}
	if cfg.adminSocket() != "/var/lib/agenthold/admin.sock" || cfg.masterKeyFile() != "/var/lib/agenthold/master.key" {
		t.Errorf("derived paths: %s %s", cfg.adminSocket(), cfg.masterKeyFile())
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct{ yaml, key string }{
		{"egress:\n  proxy_prot: 1\n", "proxy_prot"},
		{"egres:\n  disabled: true\n", "egres"},
		{"egress:\n  proxy_port: 0\n", "egress.proxy_port"},
		{"egress:\n  proxy_port: 70000\n", "egress.proxy_port"},
		{"egress:\n  dns_port: 15001\n", "15001"},
		{"egress:\n  log_keep: -1\n", "egress.log_keep"},
		{"egress:\n  dns_upstream: resolver.example\n", "egress.dns_upstream"},
		{"egress:\n  public_prefixes: [10.0.0.0]\n", "egress.public_prefixes"},
		{"egress:\n  disabled: maybe\n", "egress.disabled"},
		{"egress:\n  proxy_prot: 1\n  dns_port: x\n", "egress.dns_port"},
		{"data_dir: relative/path\n", "data_dir"},
		{"network:\n  pool4: 10.0.0.0/25\n", "network.pool4"},
		{"network:\n  pool6: 10.0.0.0/16\n", "network.pool6"},
		{"egress:\n  token_refresh: [{host: a.example}]\n", "egress.token_refresh[0]"},
	}
	for _, tt := range tests {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(tt.yaml), 0o600)
		_, err := loadConfig(path)
		if err == nil || !strings.Contains(err.Error(), tt.key) {
			t.Errorf("config %q: %v, want an error naming %s", tt.yaml, err, tt.key)
		}
	}
	cfg, err := loadConfig("")
	if err != nil || cfg.Egress.ProxyPort != 15001 {
		t.Errorf("no file: %+v %v", cfg, err)
	}
}

func TestNetworkAddrs(t *testing.T) {
	p4, p6 := mustPrefix("10.88.0.0/16"), mustPrefix("fd00:88::/48")
	gw4, sb4, gw6, sb6 := networkAddrs(p4, p6, 3)
	if gw4.String() != "10.88.3.2" || sb4.String() != "10.88.3.10" || gw6.String() != "fd00:88:0:3::2" || sb6.String() != "fd00:88:0:3::10" {
		t.Errorf("index 3: %s %s %s %s", gw4, sb4, gw6, sb6)
	}
	if n := poolSize(p4, p6); n != 256 {
		t.Errorf("pool size %d", n)
	}
}

func TestExitCodes(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "none.sock")
	tests := []struct {
		args []string
		code int
	}{
		{nil, exitUsage},
		{[]string{"bogus"}, exitUsage},
		{[]string{"agent"}, exitUsage},
		{[]string{"agent", "create"}, exitUsage},
		{[]string{"secret", "attach", "a", "s"}, exitUsage},
		{[]string{"exec", "alice", "echo"}, exitUsage},
		{[]string{"agent", "list", "--socket", socket}, exitUnreachable},
		{[]string{"log", "--socket", socket}, exitUnreachable},
		{[]string{"help"}, exitOK},
	}
	for _, tt := range tests {
		if code := run(tt.args); code != tt.code {
			t.Errorf("agenthold %v exited %d, want %d", tt.args, code, tt.code)
		}
	}
}

// TestDemoWorld builds the demo's world in namespaces, runs its session
// with real clients, and pushes the secrets through every path a value
// could leak by: the log (ring, JSON and table), the metrics, the secret
// list, the sandbox's environment, a host without a rule, an upstream
// error, and the server's own log. The value may only reach the host its
// rule names. It then checks that teardown leaves nothing behind.
func TestDemoWorld(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skipf("requires root and iproute2 to build namespaces: %v", err)
	}
	for _, c := range []string{"curl", "git", "nsenter"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("requires %s (make deps)", c)
		}
	}
	t.Setenv("AGENTHOLD_TEST_AS_CLI", "1")
	w, err := buildWorld()
	if err != nil {
		t.Fatal(err)
	}
	torn := false
	defer func() {
		if !torn {
			w.teardown()
		}
	}()
	// A second server on the same data directory refuses to start.
	second := exec.Command(w.self, "serve", "--config", filepath.Join(w.dir, "agenthold.yaml"))
	second.Env = w.env()
	if out, err := second.CombinedOutput(); err == nil || !strings.Contains(string(out), "another agenthold is running") {
		t.Fatalf("a second server on the same data directory: %v %s", err, out)
	}

	// A follower of the log sees records as they are made.
	follow := exec.Command(w.self, "log", "--follow", "--json", "--agent", "bob", "--limit", "1")
	follow.Env = w.env()
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { follow.Process.Kill(); follow.Wait() }()

	if failed := runSession(w); failed != 0 {
		t.Fatalf("%d session step(s) failed", failed)
	}
	lines := bufio.NewScanner(stdout)
	sawBob := false
	for lines.Scan() {
		if strings.Contains(lines.Text(), `"agent":"bob"`) && strings.Contains(lines.Text(), `"host":"www.example.com"`) {
			sawBob = true
			break
		}
	}
	if !sawBob {
		t.Error("the log follower did not see bob's request")
	}

	// An upstream error after injection: stop the fake API, then call it
	// with the key's placeholder in the query.
	w.internet.services["api.anthropic.com"].Close()
	out, _ := w.inSandbox("alice", `curl -sS "https://api.anthropic.com/v1/messages?key=$ANTHROPIC_API_KEY" -H "x-api-key: $ANTHROPIC_API_KEY"`)
	if !strings.Contains(out, "502") && !strings.Contains(out, "egress: upstream") {
		t.Errorf("no upstream error when the API is down: %q", out)
	}
	places := map[string]string{"the upstream error": out}
	for name, args := range map[string][]string{
		"the log (JSON)": {"log", "--json", "--limit", "0"}, "the log table": {"log", "--limit", "0"},
		"the metrics": {"metrics"}, "the secret list": {"secret", "list", "--json"}, "the agent list": {"agent", "list", "--json"},
	} {
		var b strings.Builder
		if err := w.cli(&b, args...); err != nil {
			t.Fatal(err)
		}
		places[name] = b.String()
	}
	for _, args := range [][]string{{"policy", "show", "nobody"}, {"policy", "set", "nobody", "--allow", "example.com"}, {"exec", "nobody", "--", "true"}} {
		if err := w.cli(io.Discard, args...); err == nil || !strings.Contains(err.Error(), `no agent "nobody"`) {
			t.Errorf("agenthold %v for an unknown agent: %v, want no agent", args, err)
		}
	}
	env, err := w.inSandbox("alice", "env")
	if err != nil {
		t.Fatal(err)
	}
	places["alice's environment"] = env
	echo, err := w.inSandbox("alice", `curl -sS https://echo.example.com/ -H "Authorization: Bearer $ANTHROPIC_API_KEY" -H "X-Api-Key: $GITHUB_TOKEN"`)
	if err != nil {
		t.Fatal(err)
	}
	places["a host without a rule"] = echo
	serverLog, _ := os.ReadFile(filepath.Join(w.dir, "server.log"))
	places["the server's log"] = string(serverLog)
	for where, text := range places {
		for _, v := range []string{demoAnthropicKey, demoGitHubToken} {
			if strings.Contains(text, v) {
				t.Errorf("a secret value is in %s", where)
			}
		}
	}
	if !strings.Contains(echo, "agenthold-placeholder-") {
		t.Errorf("the host without a rule did not get the placeholder: %q", echo)
	}

	// An agent can adopt a namespace made elsewhere; deleting the agent
	// unwires it but leaves the namespace to its owner.
	adopted, err := netns.Add(netns.Unique("ahadopt"))
	if err != nil {
		t.Fatal(err)
	}
	defer adopted.Delete()
	if err := w.cli(io.Discard, "agent", "create", "carol", "--mode", "allowlist", "--allow", "www.example.com", "--netns", adopted.Path()); err != nil {
		t.Fatal(err)
	}
	out, err = w.inSandbox("carol", "curl -sS http://www.example.com/")
	if err != nil || !strings.Contains(out, "Example Domain") {
		t.Fatalf("the adopted namespace has no gateway: %v %q", err, out)
	}
	if err := w.cli(io.Discard, "agent", "delete", "carol"); err != nil {
		t.Fatal(err)
	}
	if links, err := adopted.Run(context.Background(), "ip", "-o", "link"); err != nil || strings.Contains(links, "eth0") {
		t.Errorf("the adopted namespace kept its link after delete (%v): %s", err, links)
	}

	names := []string{w.gw.Name, w.inet.Name, nsName(filepath.Join(w.dir, "data"), "alice"), nsName(filepath.Join(w.dir, "data"), "bob")}
	w.teardown()
	torn = true
	list, _ := exec.CommandContext(context.Background(), "ip", "netns", "list").Output()
	for _, n := range names {
		if strings.Contains(string(list), n) {
			t.Errorf("namespace %s left behind", n)
		}
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
