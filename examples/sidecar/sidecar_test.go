package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/netns"
	"github.com/agenthold/egress/internal/readyline"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/policy"
)

// TestMain lets the test binary stand in for the sidecar binary, which
// the namespace test runs as other uids inside the Pod's namespace.
func TestMain(m *testing.M) {
	if os.Getenv("SIDECAR_TEST_AS_CLI") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// manifest is the part of a Pod spec the checks read.
type manifest struct {
	Spec struct {
		InitContainers []container `yaml:"initContainers"`
		Containers     []container `yaml:"containers"`
		Volumes        []struct {
			Name     string `yaml:"name"`
			EmptyDir *struct {
				Medium string `yaml:"medium"`
			} `yaml:"emptyDir"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type probe struct {
	HTTPGet struct {
		Port int `yaml:"port"`
	} `yaml:"httpGet"`
}

type container struct {
	Name            string   `yaml:"name"`
	Command         []string `yaml:"command"`
	RestartPolicy   string   `yaml:"restartPolicy"`
	SecurityContext struct {
		RunAsUser    *int64 `yaml:"runAsUser"`
		Capabilities struct {
			Add  []string `yaml:"add"`
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name string `yaml:"name"`
	} `yaml:"volumeMounts"`
	StartupProbe   *probe `yaml:"startupProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
}

func (c container) mounts(volume string) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return true
		}
	}
	return false
}

// TestManifests checks the Pod: each container has the capabilities it
// needs and no more, only the sidecar mounts the policy and credentials,
// the credentials live on tmpfs, probes hit only the health port, and the
// sandbox never runs as the exempt uid.
func TestManifests(t *testing.T) {
	data, err := os.ReadFile("deploy/pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	byName := map[string]container{}
	for _, c := range append(m.Spec.InitContainers, m.Spec.Containers...) {
		byName[c.Name] = c
		if len(c.SecurityContext.Capabilities.Drop) != 1 || c.SecurityContext.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s does not drop ALL capabilities", c.Name)
		}
		if c.SecurityContext.RunAsUser == nil {
			t.Errorf("%s does not set runAsUser", c.Name)
		}
	}
	rules, sidecar, trust, sandbox := byName["egress-rules"], byName["egress-sidecar"], byName["egress-trust"], byName["sandbox"]
	if got := rules.SecurityContext.Capabilities.Add; len(got) != 1 || got[0] != "NET_ADMIN" {
		t.Errorf("egress-rules adds %v, want exactly NET_ADMIN", got)
	}
	if len(sidecar.SecurityContext.Capabilities.Add) != 0 || *sidecar.SecurityContext.RunAsUser != 1337 || sidecar.RestartPolicy != "Always" {
		t.Errorf("egress-sidecar: caps %v, uid %d, restartPolicy %q", sidecar.SecurityContext.Capabilities.Add, *sidecar.SecurityContext.RunAsUser, sidecar.RestartPolicy)
	}
	for _, p := range []*probe{sidecar.StartupProbe, sidecar.ReadinessProbe, sidecar.LivenessProbe} {
		if p == nil || p.HTTPGet.Port != 15004 {
			t.Errorf("a sidecar probe is missing or not on the health port 15004")
		}
	}
	for _, c := range append(m.Spec.InitContainers, m.Spec.Containers...) {
		if c.Name != "egress-sidecar" && (c.mounts("egress-policy") || c.mounts("egress-credentials")) {
			t.Errorf("%s mounts the sidecar's policy or credentials", c.Name)
		}
		if c.Name != "egress-rules" && len(c.SecurityContext.Capabilities.Add) != 0 {
			t.Errorf("%s adds capabilities %v", c.Name, c.SecurityContext.Capabilities.Add)
		}
	}
	if *sandbox.SecurityContext.RunAsUser == 1337 || *trust.SecurityContext.RunAsUser == 1337 {
		t.Error("the sandbox (or its trust step) runs as the exempt uid 1337")
	}
	if !sidecar.mounts("egress-policy") || !sidecar.mounts("egress-credentials") || !sandbox.mounts("egress-trust") {
		t.Error("volumes are not where they belong")
	}
	for _, v := range m.Spec.Volumes {
		if v.Name == "egress-credentials" && (v.EmptyDir == nil || v.EmptyDir.Medium != "Memory") {
			t.Error("the credentials volume is not a tmpfs (emptyDir, medium Memory)")
		}
	}
	if p, err := policy.Load("deploy/policy.example.yaml"); err != nil || !p.Decide("api.anthropic.com", 443).Allowed {
		t.Errorf("policy.example.yaml: %v", err)
	}
	var creds []Credential
	cdata, _ := os.ReadFile("deploy/credentials.example.yaml")
	if err := yaml.Unmarshal(cdata, &creds); err != nil || len(creds) != 1 || creds[0].Placeholder == "" {
		t.Errorf("credentials.example.yaml: %v %+v", err, creds)
	}
}

func TestInstallCARefusesExemptUID(t *testing.T) {
	err := cmdInstallCA([]string{"--bundle", filepath.Join(t.TempDir(), "b.pem"), "--exempt-uid", fmt.Sprint(os.Getuid()), "--wait", "0s"})
	if err == nil || !strings.Contains(err.Error(), "exempt from the egress redirect") {
		t.Fatalf("install-ca as the exempt uid: %v", err)
	}
	err = cmdInstallCA([]string{"--bundle", filepath.Join(t.TempDir(), "b.pem"), "--base", "/nonexistent/ca.crt", "--exempt-uid", "54321", "--wait", "0s"})
	if err == nil || !strings.Contains(err.Error(), "needs /nonexistent/ca.crt") {
		t.Fatalf("install-ca without a base bundle: %v", err)
	}
}

// pod is a network namespace standing in for the Pod, an internet
// namespace with real servers, and the sidecar running inside the Pod as
// uid 1337.
type pod struct {
	t       *testing.T
	dir     string // readable by the sidecar's and the sandbox's uids
	ns, in  *netns.NS
	self    string
	bundle  string
	records string
	creds   string
	policy  string
	sidecar *exec.Cmd
	// baseRoots is the system bundle install-ca extends: here the test's
	// stand-in for the public web PKI.
	baseRoots string
}

const (
	sidecarUID = 1337
	sandboxUID = 1000
	upstream   = "198.18.10.1"
)

func TestPodInNamespaces(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skipf("requires root and iproute2 to build namespaces: %v", err)
	}
	for _, c := range []string{"curl", "nsenter", "setpriv", "getent"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("requires %s", c)
		}
	}
	p := newPod(t)
	p.run(0, p.self, "rules")
	p.startSidecar()

	step := func(name string) { t.Logf("step: %s", name) }
	step("policy absent: everything denied, DNS answers NXDOMAIN at once")
	p.awaitHTTP(false)
	p.dnsFailsFast("api.test")
	for name, content := range map[string]string{"empty": "", "garbage": "{{{not yaml", "enforce false": "enforce: false\nallowOut: [api.test]\n"} {
		step("policy " + name + ": everything denied")
		p.writePolicy(content)
		p.awaitHTTP(false)
	}
	good := "enforce: true\nallowOut: [api.test, api.test:2222, other.test]\n"
	step("good policy: allowed")
	p.writePolicy(good)
	p.awaitHTTP(true)
	step("bad edit after good: denied, not the old policy")
	p.writePolicy("enforce: true\nallowOut: [api.test, 'api.test:0']\n")
	p.awaitHTTP(false)
	step("deleted and recreated: followed")
	p.writePolicy(good)
	p.awaitHTTP(true)
	os.Remove(p.policy)
	p.awaitHTTP(false)
	p.writePolicy(good)
	p.awaitHTTP(true)

	step("each port reaches its listener")
	before := p.stats()
	if out, err := p.sandbox("curl", "-sS", "--max-time", "5", "http://api.test/"); err != nil {
		t.Fatalf("port 80: %v %s", err, out)
	}
	if out, err := p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "https://other.test/"); err != nil {
		t.Fatalf("port 443: %v %s", err, out)
	}
	if out, err := p.sandbox("bash", "-c", "exec 3<>/dev/tcp/api.test/2222; head -1 <&3"); err != nil || !strings.HasPrefix(out, "BANNER") {
		t.Fatalf("port 2222: %v %q", err, out)
	}
	after := p.stats()
	for port, want := range map[string]int64{"15001": 1, "15002": 1, "15003": 1} {
		if got := after[port] - before[port]; got != want {
			t.Errorf("listener %s accepted %d connections, want %d", port, got, want)
		}
	}

	step("credentials: injected for their host only")
	out, err := p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "-H", "Authorization: Bearer "+testPlaceholder, "https://api.test/")
	if err != nil || !strings.Contains(out, "Authorization=Bearer "+testCredential) || !strings.Contains(out, "X-Api-Key="+testCredential) {
		t.Fatalf("to the credential's host: %v %q", err, out)
	}
	out, err = p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "-H", "Authorization: Bearer "+testPlaceholder, "https://other.test/")
	if err != nil || strings.Contains(out, testCredential) || !strings.Contains(out, testPlaceholder) {
		t.Fatalf("to another host: %v %q", err, out)
	}

	step("the exempt uid bypasses the redirect, and no other uid does")
	p.writePolicy("enforce: true\nallowOut: [other.test]\n")
	p.awaitHTTP(false)
	if out, err := p.as(sidecarUID, "curl", "-sS", "--max-time", "5", "http://"+upstream+"/"); err != nil || !strings.Contains(out, "host="+upstream) {
		t.Fatalf("as uid %d: %v %q", sidecarUID, err, out)
	}
	for _, uid := range []int{0, sandboxUID, 4242} {
		if out, _ := p.as(uid, "curl", "-sS", "--max-time", "5", "http://"+upstream+"/"); strings.Contains(out, "host=") || !strings.Contains(out, "egress denied") {
			t.Fatalf("uid %d was not redirected and denied: %q", uid, out)
		}
	}

	step("the health port is never judged or logged as a denial")
	if out, err := p.in.Run(context.Background(), "curl", "-sS", "--max-time", "5", "http://198.18.0.2:15004/healthz"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("probe from outside: %v %q", err, out)
	}
	if out, err := p.sandbox("curl", "-sS", "--max-time", "5", "http://127.0.0.1:15004/healthz"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("probe from inside: %v %q", err, out)
	}
	for _, r := range p.readRecords() {
		if r.Port == 15004 || strings.Contains(r.Host, "15004") {
			t.Errorf("the health port was recorded: %+v", r)
		}
	}

	step("a stopped sidecar removes the credentials and leaves no network")
	p.sidecar.Process.Signal(os.Interrupt)
	p.sidecar.Wait()
	if _, err := os.Stat(p.creds); !os.IsNotExist(err) {
		t.Error("the credentials file outlived the sidecar")
	}
	p.writePolicy(good)
	for _, url := range []string{"http://api.test/", "http://" + upstream + "/"} {
		if out, err := p.sandbox("curl", "-sS", "--max-time", "5", url); err == nil || strings.Contains(out, "host=") {
			t.Fatalf("the sandbox reached %s without its sidecar: %q", url, out)
		}
	}
}

const (
	testCredential  = "sk-test-credential-5e1d"
	testPlaceholder = "sbx-placeholder-0123456789abcdef0123"
)

func newPod(t *testing.T) *pod {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "sidecar-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The build directory is root's alone: give the other uids a copy.
	bin, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "sidecar")
	if err := os.WriteFile(copyPath, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &pod{t: t, dir: dir, self: copyPath}
	p.policy = filepath.Join(dir, "policy", "policy.yaml")
	os.Mkdir(filepath.Dir(p.policy), 0o755)
	p.records = filepath.Join(dir, "records.jsonl")
	p.creds = filepath.Join(dir, "creds", "credentials.yaml")
	os.Mkdir(filepath.Dir(p.creds), 0o700)
	os.Chown(filepath.Dir(p.creds), sidecarUID, sidecarUID)
	creds := fmt.Sprintf("- hosts: [api.test]\n  header: X-Api-Key\n  value: %s\n  placeholder: %s\n", testCredential, testPlaceholder)
	if err := os.WriteFile(p.creds, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(p.creds, sidecarUID, sidecarUID)

	var addErr error
	if p.ns, addErr = netns.Add(netns.Unique("pod")); addErr != nil {
		t.Fatal(addErr)
	}
	t.Cleanup(func() { p.ns.Delete() })
	if p.in, addErr = netns.Add(netns.Unique("inet")); addErr != nil {
		t.Fatal(addErr)
	}
	t.Cleanup(func() { p.in.Delete() })
	a, b := netns.Unique("vp"), netns.Unique("vi")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(netns.Veth(p.ns, a, p.in, b))
	must(p.ns.IP("addr", "add", "198.18.0.2/24", "dev", a))
	must(p.ns.IP("route", "add", "default", "via", "198.18.0.1"))
	// Like a Pod's cluster DNS: an address off the Pod, which the rules
	// redirect to the sidecar.
	must(p.ns.SetResolvConf("nameserver 198.18.0.53\n"))
	must(p.in.IP("addr", "add", "198.18.0.1/24", "dev", b))
	must(p.in.IP("addr", "add", upstream+"/32", "dev", "lo"))
	p.startInternet()
	return p
}

// startInternet serves DNS for *.test, and on 198.18.10.1 HTTP (:80),
// HTTPS (:443, echoing request headers) and a banner (:2222).
func (p *pod) startInternet() {
	t := p.t
	root, err := mitm.NewCA("Test Public Root")
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(p.dir, "roots.pem")
	os.WriteFile(base, root.PEM(), 0o644)
	leaves := &mitm.Leaves{CA: root}
	err = p.in.Do(func() error {
		handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			q := r.Question[0]
			switch name := strings.ToLower(q.Name); {
			case name != "api.test." && name != "other.test.":
				m.Rcode = dns.RcodeNameError
			case q.Qtype == dns.TypeA:
				rr, _ := dns.NewRR(q.Name + " 60 IN A " + upstream)
				m.Answer = append(m.Answer, rr)
			}
			w.WriteMsg(m)
		})
		pc, err := net.ListenPacket("udp", "198.18.0.1:53")
		if err != nil {
			return err
		}
		testkit.ServeDNS(t, handler, pc, nil)
		echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "host=%s\n", r.Host)
			for _, k := range []string{"Authorization", "X-Api-Key"} {
				fmt.Fprintf(w, "%s=%s\n", k, r.Header.Get(k))
			}
		})
		plain, err := net.Listen("tcp", upstream+":80")
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: echo}
		go hs.Serve(plain)
		t.Cleanup(func() { hs.Close() })
		tlsLn, err := net.Listen("tcp", upstream+":443")
		if err != nil {
			return err
		}
		ts := &http.Server{Handler: echo, ErrorLog: log.New(io.Discard, "", 0)}
		ts.TLSConfig = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return leaves.Get(h.ServerName) }}
		go ts.ServeTLS(tlsLn, "", "")
		t.Cleanup(func() { ts.Close() })
		banner, err := net.Listen("tcp", upstream+":2222")
		if err != nil {
			return err
		}
		t.Cleanup(func() { banner.Close() })
		go func() {
			for {
				c, err := banner.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("BANNER server speaks first\n"))
				c.Close()
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p.bundle = filepath.Join(p.dir, "bundle.pem")
	p.baseRoots = base
}

// startSidecar runs `sidecar serve` inside the Pod as uid 1337, and the
// trust step as the sandbox's uid.
func (p *pod) startSidecar() {
	t := p.t
	cmd := exec.Command("nsenter", "--net="+p.ns.Path(), "-S", fmt.Sprint(sidecarUID), "-G", fmt.Sprint(sidecarUID), p.self, "serve",
		"--policy", p.policy, "--credentials", p.creds, "--dns-upstream", "198.18.0.1:53", "--public", "198.18.0.0/15", "--log", p.records, "--upstream-roots", p.baseRoots)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_AS_CLI=1")
	cmd.Stderr = os.Stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.sidecar = cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := readyline.Wait(stdout, "sidecar: ready", 30*time.Second); err != nil {
		t.Fatalf("the sidecar did not get ready: %v", err)
	}
	if out, err := p.as(sandboxUID, p.self, "install-ca", "--base", p.baseRoots, "--bundle", p.bundle); err != nil {
		t.Fatalf("install-ca: %v %s", err, out)
	}
	if out, err := p.as(sidecarUID, p.self, "install-ca", "--base", p.baseRoots, "--bundle", p.bundle+".x"); err == nil || !strings.Contains(out, "refusing to run as uid 1337") {
		t.Fatalf("install-ca as uid 1337 was not refused: %s", out)
	}
}

// as runs a command in the Pod as uid. ip netns exec gives it the Pod's
// resolv.conf (a resolver address the redirect sends to the sidecar,
// whatever the host's own resolver is).
func (p *pod) as(uid int, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id := fmt.Sprint(uid)
	all := append([]string{"netns", "exec", p.ns.Name, "setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups", name}, args...)
	cmd := exec.CommandContext(ctx, "ip", all...)
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_AS_CLI=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *pod) sandbox(name string, args ...string) (string, error) {
	return p.as(sandboxUID, name, args...)
}

func (p *pod) run(uid int, name string, args ...string) {
	p.t.Helper()
	if out, err := p.as(uid, name, args...); err != nil {
		p.t.Fatalf("%s %v: %v %s", name, args, err, out)
	}
}

func (p *pod) writePolicy(content string) {
	tmp := p.policy + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Rename(tmp, p.policy); err != nil {
		p.t.Fatal(err)
	}
}

// awaitHTTP waits until plain HTTP to api.test is allowed, or denied.
func (p *pod) awaitHTTP(allowed bool) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := p.sandbox("curl", "-sS", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://api.test/")
		if (err == nil && out == "200") == allowed {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("plain HTTP to api.test: %q %v; want allowed=%v", out, err, allowed)
		}
		time.Sleep(100 * time.Millisecond) // the watcher applies the file within a second
	}
}

// dnsFailsFast checks that a lookup fails with NXDOMAIN, not a timeout.
func (p *pod) dnsFailsFast(name string) {
	p.t.Helper()
	start := time.Now()
	out, err := p.sandbox("getent", "hosts", name)
	if err == nil {
		p.t.Fatalf("%s resolved under deny-all: %s", name, out)
	}
	if took := time.Since(start); took > 4*time.Second {
		p.t.Fatalf("the lookup took %v: DNS hung instead of answering NXDOMAIN", took)
	}
}

func (p *pod) stats() map[string]int64 {
	p.t.Helper()
	out, err := p.sandbox("curl", "-sS", "--max-time", "5", "http://127.0.0.1:15004/stats")
	if err != nil {
		p.t.Fatalf("stats: %v %s", err, out)
	}
	var s struct {
		Accepted map[string]int64 `json:"accepted"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		p.t.Fatalf("stats: %v %s", err, out)
	}
	return s.Accepted
}

func (p *pod) readRecords() []egresslog.Record {
	data, _ := os.ReadFile(p.records)
	var out []egresslog.Record
	for _, line := range strings.Split(string(data), "\n") {
		if r, err := egresslog.ParseJSON([]byte(line)); err == nil {
			out = append(out, r)
		}
	}
	return out
}
