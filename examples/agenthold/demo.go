//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/examples/netns"
)

// devState is where `agenthold demo --keep` leaves word of the running
// dev stack, for scripts/e2e/egress.sh and `agenthold demo --down`.
const devStateFile = "/run/agenthold-dev/state.json"

// DevState describes a running dev stack.
type DevState struct {
	PID      int    `json:"pid"`
	Socket   string `json:"socket"`
	DataDir  string `json:"data_dir"`
	Binary   string `json:"binary"`
	Gateway  string `json:"gateway_netns"`
	Internet string `json:"internet_netns"`
}

// gatewayUplink is the gateway's address on the fake internet, where
// remote agents reach it.
const gatewayUplink = "198.18.0.2"

// world is the demo's namespaces, fake internet and server.
type world struct {
	dir      string
	gw, inet *netns.NS
	internet *internet
	server   *exec.Cmd
	socket   string
	self     string
	// serveUnder is how the server enters the gateway namespace; nil
	// means nsenter --net, which leaves it in the host's mount namespace.
	serveUnder   []string
	teardownOnce sync.Once
}

func cmdDemo(_ *cliEnv, fs *flag.FlagSet, args []string) error {
	keep := fs.Bool("keep", false, "leave the stack running (make dev) until --down")
	down := fs.Bool("down", false, "tear down a stack left by --keep")
	statePath := fs.String("state", devStateFile, "with --keep and --down: the stack's state file; each stack has its own, so that several can run")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if *down {
		return demoDown(*statePath)
	}
	if err := netns.Available(); err != nil {
		return fmt.Errorf("the demo builds network namespaces: run it as root on Linux (%v)", err)
	}
	w, err := buildWorld()
	if err != nil {
		return err
	}
	defer w.teardown()
	if *keep {
		return w.serveDev(*statePath)
	}
	fmt.Println("\nThe scripted session: real clients inside the sandboxes.")
	failed := runSession(w)
	fmt.Println("\nThe request log, as `agenthold log` shows it: in the order things started, a connection above the requests it carried:")
	w.cli(os.Stdout, "log", "--limit", "100")
	if failed > 0 {
		return fmt.Errorf("%d step(s) of the demo did not go as expected", failed)
	}
	fmt.Println("\nEvery step went as expected. Cleaning up: the server removes its namespaces, links and rules.")
	return nil
}

// buildWorld creates the namespaces, the fake internet, the server and
// two agents.
func buildWorld() (w *world, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "agenthold-demo-")
	if err != nil {
		return nil, err
	}
	// Searchable, as the data directory is, so that its trust files
	// (data/trust) are readable by every uid; its own files are 0600.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	w = &world{dir: dir, self: self, socket: filepath.Join(dir, "data", "admin.sock")}
	defer func() {
		if err != nil {
			w.teardown()
		}
	}()
	step := func(format string, args ...any) { fmt.Printf("• "+format+"\n", args...) }
	step("namespaces: a fake internet and the gateway (addresses in 198.18.0.0/15; the host's network is not touched)")
	if w.inet, err = netns.Add(netns.Unique("ahinet")); err != nil {
		return w, err
	}
	if w.gw, err = netns.Add(netns.Unique("ahgw")); err != nil {
		return w, err
	}
	up, down := netns.Unique("ahu"), netns.Unique("ahd")
	if err := netns.Veth(w.gw, up, w.inet, down); err != nil {
		return w, err
	}
	for _, c := range []struct {
		ns   *netns.NS
		args []string
	}{
		{w.gw, []string{"addr", "add", gatewayUplink + "/24", "dev", up}},
		{w.gw, []string{"route", "add", "default", "via", "198.18.0.1"}},
		{w.inet, []string{"addr", "add", "198.18.0.1/24", "dev", down}},
		{w.inet, []string{"route", "add", "198.18.0.0/15", "dev", down}},
	} {
		if err := c.ns.IP(c.args...); err != nil {
			return w, err
		}
	}
	step("the fake internet: DNS for its names, an LLM API that streams, a git server that checks a token, a registry, plain HTTP, an SSH banner, an echo service, a slow service")
	if w.internet, err = startInternet(w.inet, dir); err != nil {
		return w, err
	}
	if err := w.startServer(); err != nil {
		return w, err
	}
	step("agents: alice (allowlist, two secrets) and bob (allowlist, none)")
	for _, args := range [][]string{
		{"agent", "create", "alice", "--mode", "allowlist", "--allow", "api.anthropic.com", "--allow", "github.com",
			"--allow", "*.npmjs.org", "--allow", "ssh.example.net:22", "--allow", "www.example.com", "--allow", "echo.example.com",
			"--allow", "pypi.org", "--allow", "files.pythonhosted.org"},
		{"agent", "create", "bob", "--mode", "allowlist", "--allow", "www.example.com"},
	} {
		if err := w.cli(io.Discard, args...); err != nil {
			return w, err
		}
	}
	for _, s := range []struct{ name, preset, value, agent, env string }{
		{"anthropic", "anthropic", demoAnthropicKey, "alice", "ANTHROPIC_API_KEY"},
		{"github", "github-git", demoGitHubToken, "alice", "GITHUB_TOKEN"},
	} {
		cmd := exec.Command(w.self, "secret", "put", s.name, "--preset", s.preset)
		cmd.Env = w.env()
		cmd.Stdin = strings.NewReader(s.value)
		if out, err := cmd.CombinedOutput(); err != nil {
			return w, fmt.Errorf("secret put %s: %v: %s", s.name, err, out)
		}
		if err := w.cli(io.Discard, "secret", "attach", s.agent, s.name, "--env", s.env); err != nil {
			return w, err
		}
	}
	step("secrets: the Anthropic key and a GitHub token, sealed in the vault; alice's environment holds placeholders")
	return w, nil
}

// startServer writes a configuration and runs `agenthold serve` inside
// the gateway namespace.
func (w *world) startServer() error {
	data := filepath.Join(w.dir, "data")
	// No dns_upstream: the server uses its namespace's resolv.conf, as
	// `ip netns exec` would.
	if err := w.gw.SetResolvConf("nameserver " + internetDNS + "\n"); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`data_dir: %s
ui_listen: 127.0.0.1:8088
egress:
  public_prefixes: [198.18.0.0/15]
  upstream_roots: %s
  log_file: %s
  log_file_audit: true
  kernel_path: on
  remote_listen: %s:15443
  remote_tls: true
  approvals:
    timeout: 8s
network:
  pool4: 198.19.0.0/16
  pool6: fd00:a9::/48
  agent_prefix4: 28
sandbox:
  home_size_mb: 64
  max_processes: 256
`, data, w.internet.rootFile, filepath.Join(w.dir, "egress.jsonl"), gatewayUplink)
	path := filepath.Join(w.dir, "agenthold.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	fmt.Printf("• the gateway: agenthold serve --config %s, inside the gateway namespace\n", path)
	// nsenter enters only the network namespace (ip netns exec would also
	// give the server a mount namespace of its own, hiding from everyone
	// else the sandbox namespaces it creates).
	under := w.serveUnder
	if under == nil {
		under = []string{"nsenter", "--net=" + w.gw.Path()}
	}
	w.server = exec.Command(under[0], append(under[1:], w.self, "serve", "--config", path)...)
	w.server.Env = childEnv()
	w.server.Stderr = logFile(filepath.Join(w.dir, "server.log"))
	stdout, err := w.server.StdoutPipe()
	if err != nil {
		return err
	}
	if err := w.server.Start(); err != nil {
		return err
	}
	if err := lifecycle.WaitReady(stdout, "agenthold: ready", 30*time.Second); err != nil {
		return fmt.Errorf("the server did not get ready (%v); see %s", err, filepath.Join(w.dir, "server.log"))
	}
	return nil
}

// logFile appends to path (a restarted server's log follows the first's).
func logFile(path string) io.Writer {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return io.Discard
	}
	return f
}

func (w *world) env() []string {
	return append(childEnv(), "AGENTHOLD_SOCKET="+w.socket)
}

// cli runs an agenthold command against the world's server.
func (w *world) cli(out io.Writer, args ...string) error {
	cmd := exec.Command(w.self, args...)
	cmd.Env = w.env()
	cmd.Stdout = out
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("agenthold %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return nil
}

// inSandbox runs a shell command in an agent's sandbox and returns what
// it printed.
func (w *world) inSandbox(agent, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.self, "exec", agent, "--", "sh", "-c", script)
	cmd.Env = w.env()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// teardown stops the server (which removes what it made) and removes the
// namespaces and files of the world. Calls after the first do nothing.
func (w *world) teardown() {
	w.teardownOnce.Do(w.tearDown)
}

func (w *world) tearDown() {
	if w.server != nil && w.server.Process != nil {
		w.server.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { w.server.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			w.server.Process.Kill()
			<-done
		}
	}
	if w.internet != nil {
		w.internet.close()
	}
	for _, ns := range []*netns.NS{w.gw, w.inet} {
		if ns != nil {
			ns.Delete()
		}
	}
	// A server that did not stop in time leaves its agents' homes
	// mounted.
	homes, _ := filepath.Glob(filepath.Join(w.dir, "data", "homes", "*"))
	for _, h := range homes {
		unmountHome(h)
	}
	os.RemoveAll(w.dir)
}

// serveDev keeps the stack running for `make dev` until SIGTERM, with
// word of it in statePath. A stack already there is not touched: it is
// an error.
func (w *world) serveDev(statePath string) error {
	state := DevState{PID: os.Getpid(), Socket: w.socket, DataDir: filepath.Join(w.dir, "data"), Binary: w.self, Gateway: w.gw.Name, Internet: w.inet.Name}
	if err := os.MkdirAll(filepath.Dir(statePath), 0o755); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(state, "", "  ")
	f, err := os.OpenFile(statePath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("another dev stack has %s (stop it with `agenthold demo --down --state %s`, or give another --state): %w", statePath, statePath, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	defer os.Remove(statePath)
	fmt.Printf("dev stack up: AGENTHOLD_SOCKET=%s (state in %s); stop it with `agenthold demo --down --state %s`\n", w.socket, statePath, statePath)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	return nil
}

// demoDown stops the stack whose state is in statePath.
func demoDown(statePath string) error {
	data, err := os.ReadFile(statePath)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Println("no dev stack is running")
		return nil
	}
	if err != nil {
		return err
	}
	var st DevState
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%s: %w", statePath, err)
	}
	p, err := os.FindProcess(st.PID)
	if err == nil && p.Signal(syscall.SIGTERM) == nil {
		for range 300 {
			if p.Signal(syscall.Signal(0)) != nil {
				break
			}
			time.Sleep(100 * time.Millisecond) // waiting for another process to exit
		}
	}
	os.Remove(statePath)
	fmt.Println("dev stack down")
	return nil
}
