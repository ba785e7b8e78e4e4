//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/examples/netns"
)

// TestMain lets the test binary stand in for the agenthold binary: the
// demo world runs `agenthold serve`, `exec` and friends as
// os.Executable(), which in a test is this binary.
func TestMain(m *testing.M) {
	if url := os.Getenv(goClientEnv); url != "" {
		os.Exit(goClientGet(url))
	}
	if os.Getenv("AGENTHOLD_TEST_AS_CLI") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestExampleConfigIsTheDefault(t *testing.T) {
	cfg, err := loadConfig("agenthold.example.yaml")
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%+v", defaultConfig()), fmt.Sprintf("%+v", cfg), "agenthold.example.yaml says other than the defaults")
	assert.Equal(t, "/var/lib/agenthold/admin.sock", cfg.adminSocket(), "derived paths: admin socket")
	assert.Equal(t, "/var/lib/agenthold/master.key", cfg.masterKeyFile(), "derived paths: master key")
}

// TestDeployConfig loads the configuration the DaemonSet's ConfigMap
// carries, as agenthold would; deploy/ is decoded against the Kubernetes
// API types by the module in examples/deploycheck.
func TestDeployConfig(t *testing.T) {
	data, err := os.ReadFile("deploy/daemonset.yaml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var found bool
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		if doc.Kind != "ConfigMap" {
			continue
		}
		path := filepath.Join(t.TempDir(), "agenthold.yaml")
		require.NoError(t, os.WriteFile(path, []byte(doc.Data["agenthold.yaml"]), 0o600))
		cfg, err := loadConfig(path)
		require.NoError(t, err, "the ConfigMap's agenthold.yaml")
		assert.Equal(t, "/run/agenthold/admin.sock", cfg.adminSocket(), "the admin socket is on the node's /run/agenthold")
		found = true
	}
	assert.True(t, found, "no ConfigMap in deploy/daemonset.yaml")
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
		{"egress:\n  otlp:\n    protocol: http/json\n", "egress.otlp"},
		{"egress:\n  otlp:\n    interval: -1s\n", "egress.otlp"},
		{"egress:\n  otlp:\n    log: true\n", "log"},
		{"egress:\n  private_prefixes: [10.0.0.0]\n", "egress.private_prefixes"},
		{"egress:\n  default_quotas:\n    connections_per_second: 0.5\n", "egress.default_quotas"},
		{"egress:\n  doh_endpoints: ['bad host']\n", "egress.doh_endpoints"},
		{"egress:\n  max_connections: -1\n", "egress.max_connections"},
		{"sandbox:\n  max_processes: 0\n", "sandbox.max_processes"},
		{"sandbox:\n  max_open_files: 3\n", "sandbox.max_open_files"},
	}
	for _, tt := range tests {
		path := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(path, []byte(tt.yaml), 0o600)
		_, err := loadConfig(path)
		assert.ErrorContains(t, err, tt.key, "config %q: want an error naming %s", tt.yaml, tt.key)
	}
	cfg, err := loadConfig("")
	if assert.NoError(t, err, "no file") {
		assert.Equal(t, uint16(15001), cfg.Egress.ProxyPort, "no file: %+v", cfg)
	}
}

// TestGatewayPolicy: the gateway's default quotas fill what an agent's
// policy leaves at zero, never what it sets (-1 stays no limit), and its
// DNS-over-HTTPS resolvers are refused to every agent unless an entry
// names them.
func TestGatewayPolicy(t *testing.T) {
	g := gatewayPolicy{quotas: QuotaSpec{ConnectionsPerSecond: 5000, DNSQueriesPerSecond: -1, BytesPerSecondDown: 1 << 20}, doh: []string{"doh.corp.example"}}
	p, err := PolicySpec{Mode: "open", Quotas: QuotaSpec{ConnectionsPerSecond: -1}}.compile(g)
	require.NoError(t, err)
	q := p.Quotas()
	assert.Zero(t, q.ConnectionsPerSecond, "the agent's own -1 (no limit) was replaced")
	assert.Zero(t, q.DNSQueriesPerSecond, "the gateway's -1 (no limit) was not taken")
	assert.Equal(t, float64(1<<20), q.BytesPerSecondDown)
	p, err = PolicySpec{Mode: "open"}.compile(g)
	require.NoError(t, err)
	assert.Equal(t, float64(5000), p.Quotas().ConnectionsPerSecond)
	assert.False(t, p.Decide("doh.corp.example", 443).Allowed, "an open policy reached the gateway's DoH resolver")
	assert.True(t, p.Decide("www.example.com", 443).Allowed)
	p, err = PolicySpec{Mode: "allowlist", Allow: []string{"doh.corp.example"}}.compile(g)
	require.NoError(t, err)
	assert.True(t, p.Decide("doh.corp.example", 443).Allowed, "an entry naming the resolver")
}

func TestNetworkAddrs(t *testing.T) {
	p4, p6 := mustPrefix("10.88.0.0/16"), mustPrefix("fd00:88::/48")
	gw4, sb4, gw6, sb6 := networkAddrs(p4, p6, 24, 3)
	assert.Equal(t, "10.88.3.2", gw4.String(), "index 3: gateway v4")
	assert.Equal(t, "10.88.3.10", sb4.String(), "index 3: sandbox v4")
	assert.Equal(t, "fd00:88:0:3::2", gw6.String(), "index 3: gateway v6")
	assert.Equal(t, "fd00:88:0:3::10", sb6.String(), "index 3: sandbox v6")
	assert.Equal(t, 256, poolSize(p4, p6, 24), "pool size")
	// Networks of /28: sixteen to a /24, so a /16 holds 4096 agents.
	gw4, sb4, _, _ = networkAddrs(p4, p6, 28, 17)
	assert.Equal(t, "10.88.1.18", gw4.String(), "index 17 of /28s: gateway v4")
	assert.Equal(t, "10.88.1.26", sb4.String(), "index 17 of /28s: sandbox v4")
	assert.Equal(t, 4096, poolSize(p4, p6, 28), "pool size of /28s")
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
		{[]string{"exec", "alice", "--"}, exitUsage},
		{[]string{"agent", "create", "a", "b"}, exitUsage},
		{[]string{"agent", "bogus"}, exitUsage},
		{[]string{"--socket"}, exitUsage},
		{[]string{"agent", "list", "--socket", socket}, exitUnreachable},
		{[]string{"log", "--socket", socket}, exitUnreachable},
		{[]string{"help"}, exitOK},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.code, run(tt.args), "agenthold %v exit code", tt.args)
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
	standInForCLI(t)
	w, err := buildWorld()
	require.NoError(t, err)
	torn := false
	defer func() {
		if !torn {
			w.teardown()
		}
	}()
	// A second server on the same data directory refuses to start.
	second := exec.Command(w.self, "serve", "--config", filepath.Join(w.dir, "agenthold.yaml"))
	second.Env = w.env()
	secondOut, err := second.CombinedOutput()
	require.Error(t, err, "a second server on the same data directory: %s", secondOut)
	require.Contains(t, string(secondOut), "another agenthold is running", "a second server on the same data directory")

	// A follower of the log sees records as they are made.
	follow := exec.Command(w.self, "log", "--follow", "--json", "--agent", "bob", "--limit", "1")
	follow.Env = w.env()
	stdout, err := follow.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, follow.Start())
	defer func() { follow.Process.Kill(); follow.Wait() }()

	failed := runSession(w)
	require.Zero(t, failed, "%d session step(s) failed", failed)
	lines := bufio.NewScanner(stdout)
	sawBob := false
	for lines.Scan() {
		if strings.Contains(lines.Text(), `"agent":"bob"`) && strings.Contains(lines.Text(), `"host":"www.example.com"`) {
			sawBob = true
			break
		}
	}
	assert.True(t, sawBob, "the log follower did not see bob's request")

	// An upstream error after injection: stop the fake API, then call it
	// with the key's placeholder in the query.
	w.internet.services["api.anthropic.com"].Close()
	out, _ := w.inSandbox("alice", `curl -sS "https://api.anthropic.com/v1/messages?key=$ANTHROPIC_API_KEY" -H "x-api-key: $ANTHROPIC_API_KEY"`)
	assert.True(t, strings.Contains(out, "502") || strings.Contains(out, "egress: upstream"), "no upstream error when the API is down: %q", out)
	places := map[string]string{"the upstream error": out}
	for name, args := range map[string][]string{
		"the log (JSON)": {"log", "--json", "--limit", "0"}, "the log table": {"log", "--limit", "0"},
		"the metrics": {"metrics"}, "the secret list": {"secret", "list", "--json"}, "the agent list": {"agent", "list", "--json"},
	} {
		var b strings.Builder
		require.NoError(t, w.cli(&b, args...), name)
		places[name] = b.String()
	}
	for _, args := range [][]string{{"policy", "show", "nobody"}, {"policy", "set", "nobody", "--allow", "example.com"}, {"exec", "nobody", "--", "true"}} {
		assert.ErrorContains(t, w.cli(io.Discard, args...), `no agent "nobody"`, "agenthold %v for an unknown agent", args)
	}
	env, err := w.inSandbox("alice", "env")
	require.NoError(t, err)
	places["alice's environment"] = env
	echo, err := w.inSandbox("alice", `curl -sS https://echo.example.com/ -H "Authorization: Bearer $ANTHROPIC_API_KEY" -H "X-Api-Key: $GITHUB_TOKEN"`)
	require.NoError(t, err)
	places["a host without a rule"] = echo
	serverLog, _ := os.ReadFile(filepath.Join(w.dir, "server.log"))
	places["the server's log"] = string(serverLog)
	// The persistent log file holds every record, for root only.
	logFile := filepath.Join(w.dir, "egress.jsonl")
	fileLog, err := os.ReadFile(logFile)
	require.NoError(t, err)
	places["the log file"] = string(fileLog)
	assert.Contains(t, string(fileLog), `"agent":"bob","kind":"http","host":"www.example.com"`)
	if st, err := os.Stat(logFile); assert.NoError(t, err) {
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	}
	for where, text := range places {
		for _, v := range []string{demoAnthropicKey, demoGitHubToken} {
			// Not assert.NotContains: its message would print the secret.
			assert.False(t, strings.Contains(text, v), "a secret value is in %s", where)
		}
	}
	assert.Contains(t, echo, "agenthold-placeholder-", "the host without a rule did not get the placeholder")

	// An agent can adopt a namespace made elsewhere; deleting the agent
	// unwires it but leaves the namespace to its owner.
	adopted, err := netns.Add(netns.Unique("ahadopt"))
	require.NoError(t, err)
	defer adopted.Delete()
	require.NoError(t, w.cli(io.Discard, "agent", "create", "carol", "--mode", "allowlist", "--allow", "www.example.com", "--netns", adopted.Path()))
	out, err = w.inSandbox("carol", "curl -sS http://www.example.com/")
	require.NoError(t, err, "the adopted namespace has no gateway: %q", out)
	require.Contains(t, out, "Example Domain", "the adopted namespace has no gateway")
	// The production path: a container joins the adopted namespace. Here
	// the confinement a runtime would set up comes from util-linux (new
	// mount and PID namespaces, an unprivileged uid, no capability,
	// no_new_privs), with the namespace's resolv.conf as the runtime
	// would mount it.
	container := exec.Command("nsenter", "--net="+adopted.Path(), "--",
		"unshare", "--mount", "--pid", "--fork", "--mount-proc", "--",
		"sh", "-c", `mount --bind /etc/netns/$0/resolv.conf /etc/resolv.conf && exec setpriv --reuid=4242 --regid=4242 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- sh -c 'id -u; grep CapEff /proc/self/status; curl -sS --max-time 10 http://www.example.com/'`, adopted.Name)
	container.Env = childEnv()
	out2, err := container.CombinedOutput()
	require.NoError(t, err, "%s", out2)
	assert.Contains(t, string(out2), "4242\n")
	assert.Contains(t, string(out2), "CapEff:\t0000000000000000")
	assert.Contains(t, string(out2), "Example Domain", "a container in the adopted namespace reaches the web through the gateway")
	require.NoError(t, w.cli(io.Discard, "agent", "delete", "carol"))
	links, err := adopted.Run(context.Background(), "ip", "-o", "link")
	assert.NoError(t, err, "the adopted namespace's links after delete: %s", links)
	assert.NotContains(t, links, "eth0", "the adopted namespace kept its link after delete")

	names := []string{w.gw.Name, w.inet.Name, nsName(filepath.Join(w.dir, "data"), "alice"), nsName(filepath.Join(w.dir, "data"), "bob")}
	w.teardown()
	torn = true
	list, _ := exec.CommandContext(context.Background(), "ip", "netns", "list").Output()
	for _, n := range names {
		assert.NotContains(t, string(list), n, "namespace %s left behind", n)
	}
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// standInForCLI lets this test binary run as agenthold for the programs
// the world starts, without the race detector's second of sleep at the
// exit of each.
func standInForCLI(t *testing.T) {
	t.Setenv(testAsCLIEnv, "1")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
}

// requireWorld skips unless the demo's world can be built here, and
// builds it.
func requireWorld(t *testing.T) *world {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skipf("requires root and iproute2 to build namespaces: %v", err)
	}
	for _, c := range []string{"curl", "git", "nsenter", "nft"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("requires %s (make deps)", c)
		}
	}
	standInForCLI(t)
	w, err := buildWorld()
	require.NoError(t, err)
	t.Cleanup(w.teardown)
	return w
}

// TestSandboxConfinement runs a hostile script through `agenthold exec`
// and checks that every way out it tries fails, while the same sandbox,
// as the same user, still reaches what its policy allows, with its
// credential injected.
func TestSandboxConfinement(t *testing.T) {
	w := requireWorld(t)
	data := filepath.Join(w.dir, "data")
	var bobNS string
	for _, a := range w.agentInfos(t) {
		if a.Name == "bob" {
			bobNS = a.NetNS
		}
	}
	require.NotEmpty(t, bobNS)
	serverPID := w.server.Process.Pid
	alice := w.agentInfo(t, "alice")

	// A command the operator left in the host's /tmp is not in the
	// sandbox's, and the error says why.
	hostTmp, err := os.CreateTemp("/tmp", "agenthold-cmd-")
	require.NoError(t, err)
	hostTmp.Close()
	t.Cleanup(func() { os.Remove(hostTmp.Name()) })
	require.NoError(t, os.Chmod(hostTmp.Name(), 0o755))
	inTmp := exec.Command(w.self, "exec", "alice", "--", hostTmp.Name())
	inTmp.Env = w.env()
	missing, err := inTmp.CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(missing), hostTmp.Name()+": no such file or directory (/tmp is private to each sandbox", "exec of a host /tmp path: %s", missing)

	// A key in the caller's session keyring (a login's holds the
	// operator's), a world-writable directory on the host, and a service
	// on the tunnel port, which is closed by default.
	key, err := unix.AddKey("user", "agenthold-operator-token", []byte("operator-secret"), unix.KEY_SPEC_SESSION_KEYRING)
	require.NoError(t, err)
	t.Cleanup(func() { unix.KeyctlInt(unix.KEYCTL_INVALIDATE, key, 0, 0, 0) })
	shared, err := os.MkdirTemp("/var/lib", "agenthold-shared-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(shared) })
	require.NoError(t, os.Chmod(shared, 0o1777))
	var tunnel net.Listener
	require.NoError(t, w.gw.Do(func() (err error) { tunnel, err = net.Listen("tcp", ":15022"); return err }))
	defer tunnel.Close()
	go func() {
		for c, err := tunnel.Accept(); err == nil; c, err = tunnel.Accept() {
			c.Write([]byte("tunnel-service\n"))
			c.Close()
		}
	}()

	// Each probe prints one line: the name of the escape, then "blocked"
	// or what it got.
	probes := []struct{ name, script string }{
		{"uid is not root", `[ "$(id -u)" != 0 ] && echo blocked`},
		{"no supplementary group", `[ "$(id -G)" = "$(id -g)" ] && echo blocked`},
		{"no capability in any set", `grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | grep -qv '0000000000000000' || echo blocked`},
		{"no_new_privs", `grep -q '^NoNewPrivs:.*1' /proc/self/status && echo blocked`},
		{"master key", `cat ` + filepath.Join(data, "master.key") + ` >/dev/null 2>&1 || echo blocked`},
		{"CA key", `cat ` + filepath.Join(data, "egress", "ca.key") + ` >/dev/null 2>&1 || echo blocked`},
		{"sealed secrets", `cat ` + filepath.Join(data, "secrets.json") + ` >/dev/null 2>&1 || echo blocked`},
		{"agent records", `cat ` + filepath.Join(data, "agents.json") + ` >/dev/null 2>&1 || echo blocked`},
		{"admin socket", `curl -s --max-time 2 --unix-socket ` + w.socket + ` http://agenthold/v1/agents >/dev/null 2>&1 || echo blocked`},
		{"namespaces listed", `[ -z "$(ls -A /run/netns 2>/dev/null)" ] && echo blocked`},
		{"another agent's namespace", `nsenter --net=/run/netns/` + bobNS + ` true 2>/dev/null || echo blocked`},
		{"the init namespace through /proc/1", `nsenter --net=/proc/1/ns/net true 2>/dev/null || echo blocked`},
		{"the server's process", fmt.Sprintf(`[ ! -e /proc/%d ] && ! kill -0 %d 2>/dev/null && echo blocked`, serverPID, serverPID)},
		{"only its own processes", `[ "$(ls -d /proc/[0-9]* | wc -l)" -lt 8 ] && echo blocked`},
		{"the demo's files in /tmp", `[ ! -e ` + w.dir + `/agenthold.yaml ] && echo blocked`},
		{"no inherited descriptor", `[ "$(ls /proc/self/fd | sort -n | tr '\n' ' ')" = "0 1 2 3 " ] && echo blocked`},
		{"writes to the host", `touch /etc/agenthold-escape 2>/dev/null || echo blocked`},
		{"a world-writable host directory", `touch ` + shared + `/planted 2>/dev/null || echo blocked`},
		{"the host's /run and its lock files", `[ -z "$(ls -A /run)" ] && [ ! -e /run/lock ] && echo blocked`},
		{"the operator's keyring", `grep -q agenthold-operator-token /proc/keys || echo blocked`},
		{"the tunnel port", `timeout 3 bash -c 'exec 3<>/dev/tcp/` + alice.Gateway4 + `/15022; head -1 <&3' 2>/dev/null | grep -q tunnel-service || echo blocked`},
		{"the list of namespaces in /etc/netns", `[ -z "$(ls -A /etc/netns 2>/dev/null)" ] && echo blocked`},
		{"filling the disk from its home", `! head -c 100M /dev/zero > "$HOME/fill" 2>/dev/null && [ "$(stat -c %s "$HOME/fill")" -le $((64 << 20)) ] && rm -f "$HOME/fill" && echo blocked`},
	}
	var script strings.Builder
	for _, p := range probes {
		fmt.Fprintf(&script, "printf '%%s: ' %q; ( %s ) | head -1; echo\n", p.name, p.script)
	}
	out, err := w.inSandbox("alice", script.String())
	require.NoError(t, err, out)
	for _, p := range probes {
		assert.Regexp(t, `(?m)^`+regexp.QuoteMeta(p.name)+`: blocked$`, out, "escape %q", p.name)
	}
	_, err = os.Stat("/etc/agenthold-escape")
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(shared, "planted"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	// A regular file the operator's output goes to reaches the sandbox as
	// a pipe: it cannot reopen the file through /proc to read it.
	outFile := filepath.Join(t.TempDir(), "out.log")
	require.NoError(t, os.WriteFile(outFile, []byte("operator-line\n"), 0o644))
	f, err := os.OpenFile(outFile, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	cmd := exec.Command(w.self, "exec", "alice", "--", "sh", "-c", "readlink /proc/self/fd/1")
	cmd.Env, cmd.Stdout = w.env(), f
	require.NoError(t, cmd.Run())
	f.Close()
	written, err := os.ReadFile(outFile)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^pipe:\[`, string(written), "the sandbox's stdout is a pipe, relayed to the file")

	// The same sandbox, as the same user: TLS passed through to an
	// allowed host, and an intercepted host that sees the injected key.
	out, err = w.inSandbox("alice", `id -u; curl -sS --noproxy '*' https://registry.npmjs.org/x; echo; curl -sS -N --noproxy '*' https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}'`)
	require.NoError(t, err, out)
	assert.Contains(t, out, fmt.Sprintf("%d\n", alice.UID))
	assert.NotEqual(t, uint32(0), alice.UID)
	assert.Contains(t, out, `"served-by":"registry.npmjs.org"`)
	assert.Contains(t, out, "message_stop", "the fake API answers only with the injected key")

	// Files the agent writes stay in its home, and survive the exec.
	_, err = w.inSandbox("alice", `echo kept > note && pwd`)
	require.NoError(t, err)
	out, err = w.inSandbox("alice", `cat note; stat -c %u note`)
	require.NoError(t, err, out)
	assert.Equal(t, fmt.Sprintf("kept\n%d\n", alice.UID), out)
	out, err = w.inSandbox("bob", `cat /home/alice/note 2>&1 || echo blocked`)
	require.NoError(t, err)
	assert.Contains(t, out, "blocked", "bob reads alice's home")

	// exec passes the command's exit status on.
	_, err = w.inSandbox("alice", "exit 7")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 7, ee.ExitCode())
}

// TestExecTerminal: an operator at a terminal gives the sandbox a
// pseudo-terminal of its own, whose settings the sandbox may change
// without changing the operator's.
func TestExecTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("requires script (util-linux) for a terminal")
	}
	w := requireWorld(t)
	inner := w.self + ` exec alice -- sh -c 'stty -echo; echo "inside: $(tty)"'; stty -a | grep -o -- " -\?echo " | head -1 | sed "s/^/after: /"`
	cmd := exec.Command("script", "-qec", inner, "/dev/null")
	cmd.Env = w.env()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `inside: /dev/pts/\d+`, string(out), "the sandbox has a terminal")
	assert.Contains(t, string(out), "after:  echo ", "the operator's terminal kept its echo: %s", out)
}

// TestAgentsNeverShareAUid: a deleted agent's uid (and with it its files
// and kernel keys) never goes to a later one, an operator's uid is checked,
// and deleting an agent ends its running sandboxes.
func TestAgentsNeverShareAUid(t *testing.T) {
	w := requireWorld(t)
	alice := w.agentInfo(t, "alice")
	require.NoError(t, w.cli(io.Discard, "agent", "create", "dave", "--mode", "allowlist", "--allow", "www.example.com"))
	dave := w.agentInfo(t, "dave")
	assert.NotEqual(t, alice.UID, dave.UID)

	// A sandbox of dave's, running when dave is deleted.
	sleeper := exec.Command(w.self, "exec", "dave", "--", "sleep", "60")
	sleeper.Env = w.env()
	require.NoError(t, sleeper.Start())
	done := make(chan error, 1)
	go func() { done <- sleeper.Wait() }()
	require.Eventually(t, func() bool {
		out, _ := exec.Command("pgrep", "-u", fmt.Sprint(dave.UID), "sleep").Output()
		return len(out) > 0
	}, 10*time.Second, 50*time.Millisecond, "dave's sandbox did not start")
	require.NoError(t, w.cli(io.Discard, "agent", "delete", "dave"))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		sleeper.Process.Kill()
		t.Fatal("dave's sandbox outlived dave")
	}

	require.NoError(t, w.cli(io.Discard, "agent", "create", "erin", "--mode", "allowlist", "--allow", "www.example.com"))
	erin := w.agentInfo(t, "erin")
	assert.NotEqual(t, dave.UID, erin.UID, "erin got deleted dave's uid")
	assert.NotEqual(t, alice.UID, erin.UID)
	for _, args := range [][]string{
		{"--uid", "1", "--gid", "1"},
		{"--uid", fmt.Sprint(alice.UID), "--gid", "4242"},
		{"--uid", "4242"},
	} {
		err := w.cli(io.Discard, append([]string{"agent", "create", "frank"}, args...)...)
		assert.Error(t, err, "uid %v accepted", args)
	}
	require.NoError(t, w.cli(io.Discard, "agent", "create", "frank", "--uid", "4242", "--gid", "4242"))
	assert.Equal(t, uint32(4242), w.agentInfo(t, "frank").UID)
}

// TestServerCrashRecovery kills the server with SIGKILL while two agents
// exist and starts it again, twice: the second time under `ip netns
// exec`, whose private mount namespace took the first sandbox namespaces
// with it. Each time both agents work again, with exactly one namespace,
// veth pair and nftables table each, and nothing left over.
func TestServerCrashRecovery(t *testing.T) {
	w := requireWorld(t)
	data := filepath.Join(w.dir, "data")
	works := func(when string) {
		t.Helper()
		out, err := w.inSandbox("alice", `curl -sS -N https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}'`)
		assert.NoError(t, err, "%s: alice: %s", when, out)
		assert.Contains(t, out, "message_stop", "%s: alice's injected call", when)
		out, err = w.inSandbox("bob", `curl -sS http://www.example.com/`)
		assert.NoError(t, err, "%s: bob: %s", when, out)
		assert.Contains(t, out, "Example Domain", "%s: bob", when)
	}
	exactlyOneEach := func(when string) {
		t.Helper()
		list, err := exec.Command("ip", "netns", "list").Output()
		require.NoError(t, err)
		count := map[string]int{}
		for _, line := range strings.Split(string(list), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], nsPrefix(data)) {
				count[f[0]]++
			}
		}
		assert.Equal(t, map[string]int{nsName(data, "alice"): 1, nsName(data, "bob"): 1}, count, "%s: the namespaces of this server", when)
		links, err := w.gw.Run(context.Background(), "ip", "-o", "link")
		require.NoError(t, err)
		assert.Equal(t, 2, strings.Count(links, linkPrefix(data)), "%s: veth pairs in %s", when, links)
		tables, err := w.gw.Run(context.Background(), "nft", "list", "tables")
		require.NoError(t, err)
		assert.Equal(t, 1, strings.Count(tables, tableName(data)), "%s: tables %s", when, tables)
	}
	works("before the crash")
	exactlyOneEach("before the crash")

	crash := func() {
		t.Helper()
		require.NoError(t, w.server.Process.Kill())
		w.server.Wait()
		// While it is down, the sandboxes have no network.
		out, err := exec.Command("ip", "netns", "exec", nsName(data, "bob"), "curl", "-sS", "--max-time", "3", "http://www.example.com/").CombinedOutput()
		assert.Error(t, err, "a sandbox reached the network with the server down: %s", out)
	}
	crash()
	require.NoError(t, w.startServer())
	works("after a restart")
	exactlyOneEach("after a restart")

	// Under `ip netns exec` the server has a mount namespace of its own:
	// it adopts the namespaces it finds, and those it creates are mounted
	// only there (exec reaches them through /proc/PID/root).
	crash()
	w.serveUnder = []string{"ip", "netns", "exec", w.gw.Name}
	require.NoError(t, w.startServer())
	works("after a restart under ip netns exec")
	exactlyOneEach("after a restart under ip netns exec")
	require.NoError(t, w.cli(io.Discard, "agent", "create", "carol", "--mode", "allowlist", "--allow", "www.example.com"))
	out, err := w.inSandbox("carol", "curl -sS http://www.example.com/")
	assert.NoError(t, err, out)
	assert.Contains(t, out, "Example Domain", "exec into a namespace mounted in the server's private mount namespace")
	serverLog, err := os.ReadFile(filepath.Join(w.dir, "server.log"))
	require.NoError(t, err)
	assert.Contains(t, string(serverLog), "mount namespace of its own", "the private mount namespace is reported")
	assert.Contains(t, string(serverLog), "/etc/netns/"+w.gw.Name+"/resolv.conf", "the DNS upstream's source is reported")

	// Its crash takes carol's namespace with its mount namespace, leaving
	// a bare file at the path: the next server makes it again.
	require.NoError(t, w.server.Process.Kill())
	w.server.Wait()
	w.serveUnder = nil
	require.NoError(t, w.startServer())
	works("after the private mount namespace died")
	out, err = w.inSandbox("carol", "curl -sS http://www.example.com/")
	assert.NoError(t, err, out)
	assert.Contains(t, out, "Example Domain", "carol after her namespace was made again")

	w.teardown()
	list, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	assert.NotContains(t, string(list), nsPrefix(data), "namespaces left after the server stopped")
}

// agentInfos lists the world's agents through the command line.
func (w *world) agentInfos(t *testing.T) []AgentInfo {
	t.Helper()
	var b strings.Builder
	require.NoError(t, w.cli(&b, "agent", "list", "--json"))
	var list []AgentInfo
	require.NoError(t, json.Unmarshal([]byte(b.String()), &list))
	return list
}

func (w *world) agentInfo(t *testing.T, name string) AgentInfo {
	t.Helper()
	for _, a := range w.agentInfos(t) {
		if a.Name == name {
			return a
		}
	}
	require.FailNow(t, fmt.Sprintf("no agent %s", name))
	return AgentInfo{}
}
