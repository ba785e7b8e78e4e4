//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/otlptest"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
	"github.com/agenthold/egress/policy/policyfile"
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
	require.NoError(t, err)
	var m manifest
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	require.NoError(t, dec.Decode(&m))
	byName := map[string]container{}
	for _, c := range append(m.Spec.InitContainers, m.Spec.Containers...) {
		byName[c.Name] = c
		assert.Equal(t, []string{"ALL"}, c.SecurityContext.Capabilities.Drop, "%s does not drop ALL capabilities", c.Name)
		assert.NotNil(t, c.SecurityContext.RunAsUser, "%s does not set runAsUser", c.Name)
	}
	rules, sidecar, trust, sandbox := byName["egress-rules"], byName["egress-sidecar"], byName["egress-trust"], byName["sandbox"]
	assert.Equal(t, []string{"NET_ADMIN"}, rules.SecurityContext.Capabilities.Add, "egress-rules adds capabilities: want exactly NET_ADMIN")
	assert.Empty(t, sidecar.SecurityContext.Capabilities.Add, "egress-sidecar: caps")
	assert.Equal(t, int64(1337), *sidecar.SecurityContext.RunAsUser, "egress-sidecar: uid")
	assert.Equal(t, "Always", sidecar.RestartPolicy, "egress-sidecar: restartPolicy")
	for _, p := range []*probe{sidecar.StartupProbe, sidecar.ReadinessProbe, sidecar.LivenessProbe} {
		if assert.NotNil(t, p, "a sidecar probe is missing") {
			assert.Equal(t, 15004, p.HTTPGet.Port, "a sidecar probe is not on the health port 15004")
		}
	}
	for _, c := range append(m.Spec.InitContainers, m.Spec.Containers...) {
		if c.Name != "egress-sidecar" {
			assert.False(t, c.mounts("egress-policy"), "%s mounts the sidecar's policy", c.Name)
			assert.False(t, c.mounts("egress-credentials"), "%s mounts the sidecar's credentials", c.Name)
		}
		if c.Name != "egress-rules" {
			assert.Empty(t, c.SecurityContext.Capabilities.Add, "%s adds capabilities", c.Name)
		}
	}
	assert.NotEqual(t, int64(1337), *sandbox.SecurityContext.RunAsUser, "the sandbox runs as the exempt uid 1337")
	assert.NotEqual(t, int64(1337), *trust.SecurityContext.RunAsUser, "the sandbox's trust step runs as the exempt uid 1337")
	assert.True(t, sidecar.mounts("egress-policy"), "volumes are not where they belong: egress-sidecar does not mount egress-policy")
	assert.True(t, sidecar.mounts("egress-credentials"), "volumes are not where they belong: egress-sidecar does not mount egress-credentials")
	assert.True(t, sandbox.mounts("egress-trust"), "volumes are not where they belong: sandbox does not mount egress-trust")
	for _, v := range m.Spec.Volumes {
		if v.Name == "egress-credentials" && assert.NotNil(t, v.EmptyDir, "the credentials volume is not a tmpfs (emptyDir, medium Memory)") {
			assert.Equal(t, "Memory", v.EmptyDir.Medium, "the credentials volume is not a tmpfs (emptyDir, medium Memory)")
		}
	}
	if p, err := policyfile.Load("deploy/policy.example.yaml"); assert.NoError(t, err, "policy.example.yaml") {
		assert.True(t, p.Decide("api.anthropic.com", 443).Allowed, "policy.example.yaml: api.anthropic.com:443 is not allowed")
	}
	var creds []Credential
	cdata, _ := os.ReadFile("deploy/credentials.example.yaml")
	if err := yaml.Unmarshal(cdata, &creds); assert.NoError(t, err, "credentials.example.yaml") && assert.Len(t, creds, 1, "credentials.example.yaml") {
		assert.NotEmpty(t, creds[0].Placeholder, "credentials.example.yaml: placeholder")
	}
}

func TestInstallCARefusesExemptUID(t *testing.T) {
	err := cmdInstallCA([]string{"--bundle", filepath.Join(t.TempDir(), "b.pem"), "--exempt-uid", fmt.Sprint(os.Getuid()), "--wait", "0s"})
	require.ErrorContains(t, err, "exempt from the egress redirect", "install-ca as the exempt uid")
	err = cmdInstallCA([]string{"--bundle", filepath.Join(t.TempDir(), "b.pem"), "--base", "/nonexistent/ca.crt", "--exempt-uid", "54321", "--wait", "0s"})
	require.ErrorContains(t, err, "needs /nonexistent/ca.crt", "install-ca without a base bundle")
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
	// webhookSecret is the file of the approval webhook's key, sealKey
	// the seed of the key that seals the records.
	webhookSecret, sealKey string
	// collector is the OpenTelemetry collector the sidecar sends its
	// records, spans and counters to, over gRPC.
	collector *otlptest.Receiver
}

// webhookKey is the approval webhook's HMAC key: the control plane's and
// the sidecar's.
const webhookKey = "control-plane-approval-key-7f3a"

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
	out, err := p.sandbox("curl", "-sS", "--max-time", "5", "http://api.test/")
	require.NoError(t, err, "port 80: %s", out)
	out, err = p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "https://other.test/")
	require.NoError(t, err, "port 443: %s", out)
	out, err = p.sandbox("bash", "-c", "exec 3<>/dev/tcp/api.test/2222; head -1 <&3")
	require.NoError(t, err, "port 2222: %q", out)
	require.True(t, strings.HasPrefix(out, "BANNER"), "port 2222: %q", out)
	after := p.stats()
	for port, want := range map[string]int64{"15001": 1, "15002": 1, "15003": 1} {
		assert.Equal(t, want, after[port]-before[port], "connections listener %s accepted", port)
	}

	step("credentials: injected for their host only")
	out, err = p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "-H", "Authorization: Bearer "+testPlaceholder, "https://api.test/")
	require.NoError(t, err, "to the credential's host: %q", out)
	require.Contains(t, out, "credential-seen=true", "the credential's host got the credential")
	assert.False(t, strings.Contains(out, testCredential), "the host's echo of the credential reached the sandbox")
	assert.Contains(t, out, "Authorization=Bearer "+testPlaceholder, "the echo comes back with the placeholder")
	out, err = p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "-H", "Authorization: Bearer "+testPlaceholder, "https://other.test/")
	require.NoError(t, err, "to another host: %q", out)
	require.Contains(t, out, "credential-seen=false", "another host got the credential")
	require.Contains(t, out, testPlaceholder, "to another host")

	step("telemetry: the request's record and span reach the collector, the span in the sandbox's own trace; the counters too")
	const trace, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	out, err = p.sandbox("curl", "-sS", "--max-time", "5", "--cacert", p.bundle, "-H", "traceparent: 00-"+trace+"-"+parent+"-01", "-H", "X-Api-Key: "+testPlaceholder, "https://api.test/traced")
	require.NoError(t, err, "a traced request: %q", out)
	require.Eventually(t, func() bool {
		p.collector.Mu.Lock()
		defer p.collector.Mu.Unlock()
		var span, record bool
		for _, s := range p.collector.Spans {
			a := otlptest.Attrs(s.Attributes)
			span = span || (a["url.path"] == "/traced" && a["egress.secret"] != nil && hex.EncodeToString(s.TraceId) == trace && hex.EncodeToString(s.ParentSpanId) == parent)
		}
		for _, r := range p.collector.Logs {
			a := otlptest.Attrs(r.Attributes)
			record = record || (a["url.path"] == "/traced" && a["server.address"] == "api.test" && a["egress.allowed"] == true)
		}
		return span && record && p.collector.Metrics["egress.records"] != nil && slices.Contains(p.collector.Services, "egress-sidecar")
	}, 10*time.Second, 50*time.Millisecond, "the collector did not get the record, the span in the sandbox's trace, and the counters")
	p.collector.Mu.Lock()
	for _, r := range p.collector.Logs {
		assert.NotContains(t, fmt.Sprint(otlptest.Attrs(r.Attributes)), testCredential, "a credential reached the collector")
	}
	for _, s := range p.collector.Spans {
		assert.NotContains(t, fmt.Sprint(otlptest.Attrs(s.Attributes)), testCredential, "a credential reached the collector")
	}
	p.collector.Mu.Unlock()

	step("request entries in the policy file: each request judged by its method and path")
	p.writePolicy("enforce: true\nallowOut: ['GET,HEAD api.test/public/**', other.test]\ndeny: ['DELETE other.test/**']\n")
	p.awaitHTTP(false) // "/" is not under /public
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"http://api.test/public/x"}, "^200 $"},
		{[]string{"-X", "POST", "http://api.test/public/x"}, "^403 .*no request rule allows the method and path"},
		{[]string{"http://api.test/public/../admin"}, "^403 "},
		{[]string{"--cacert", p.bundle, "https://other.test/x"}, "^200 $"}, // intercepted: a deny entry judges its requests
		{[]string{"--cacert", p.bundle, "-X", "DELETE", "https://other.test/x"}, "^403 .*a deny entry matches: !DELETE other.test/\\*\\*"},
	} {
		args := append([]string{"-sS", "--max-time", "5", "--path-as-is", "-o", "/dev/null", "-w", "%{http_code} %header{proxy-status}"}, tc.args...)
		out, err := p.sandbox("curl", args...)
		require.NoError(t, err, "curl %v: %q", tc.args, out)
		assert.Regexp(t, tc.want, out, "curl %v", tc.args)
	}

	step("ask mode: the control plane's webhook answers while the sandbox waits; an answer it did not sign is not taken")
	p.writePolicy("enforce: true\nmode: ask\nallowOut: [api.test]\n")
	p.awaitHTTP(true)
	out, err = p.sandbox("curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", p.bundle, "https://other.test/")
	require.NoError(t, err, "approved by the webhook: %q", out)
	assert.Equal(t, "200", out)
	out, err = p.sandbox("curl", "-sS", "--max-time", "10", "--cacert", p.bundle, "https://third.test/")
	require.Error(t, err, "an answer signed with another key was taken: %q", out)
	var timedOut bool
	require.Eventually(t, func() bool {
		for _, r := range p.readRecords() {
			timedOut = timedOut || (r.Host == "third.test" && r.Reason == policy.ReasonApprovalTimeout)
		}
		return timedOut
	}, 10*time.Second, 50*time.Millisecond, "third.test was not refused at the timeout")

	step("the exempt uid bypasses the redirect, and no other uid does")
	p.writePolicy("enforce: true\nallowOut: [other.test]\n")
	p.awaitHTTP(false)
	out, err = p.as(sidecarUID, "curl", "-sS", "--max-time", "5", "http://"+upstream+"/")
	require.NoError(t, err, "as uid %d: %q", sidecarUID, out)
	require.Contains(t, out, "host="+upstream, "as uid %d", sidecarUID)
	for _, uid := range []int{0, sandboxUID, 4242} {
		out, _ := p.as(uid, "curl", "-sS", "--max-time", "5", "http://"+upstream+"/")
		require.NotContains(t, out, "host=", "uid %d was not redirected and denied", uid)
		require.Contains(t, out, "egress denied", "uid %d was not redirected and denied", uid)
	}

	step("the DNS and proxy ports answer the Pod only")
	err = p.in.Do(func() error {
		m := new(dns.Msg)
		m.SetQuestion("api.test.", dns.TypeA)
		for _, network := range []string{"udp", "tcp"} {
			c := &dns.Client{Net: network, Timeout: time.Second}
			_, _, err := c.Exchange(m, "198.18.0.2:15053")
			assert.Error(t, err, "a %s query from outside the Pod was answered", network)
		}
		for _, port := range []string{"15001", "15002", "15003"} {
			c, err := net.DialTimeout("tcp", "198.18.0.2:"+port, time.Second)
			if err == nil {
				c.Close()
			}
			assert.Error(t, err, "port %s accepted a connection from outside the Pod", port)
		}
		return nil
	})
	require.NoError(t, err)

	step("the health port is never judged or logged as a denial")
	out, err = p.in.Run(context.Background(), "curl", "-sS", "--max-time", "5", "http://198.18.0.2:15004/healthz")
	require.NoError(t, err, "probe from outside: %q", out)
	require.Equal(t, "ok", strings.TrimSpace(out), "probe from outside")
	out, err = p.sandbox("curl", "-sS", "--max-time", "5", "http://127.0.0.1:15004/healthz")
	require.NoError(t, err, "probe from inside: %q", out)
	require.Equal(t, "ok", strings.TrimSpace(out), "probe from inside")
	for _, r := range p.readRecords() {
		assert.NotEqual(t, uint16(15004), r.Port, "the health port was recorded: %+v", r)
		assert.NotContains(t, r.Host, "15004", "the health port was recorded: %+v", r)
	}

	step("suggest: a policy file of what the sandbox used, nothing it was refused")
	out, err = p.as(0, p.self, "suggest", "--log", p.records)
	require.NoError(t, err, "suggest: %s", out)
	learnt, err := policyfile.Parse([]byte(out))
	require.NoError(t, err, "the suggestion is not a policy file:\n%s", out)
	for _, use := range []struct {
		host string
		port uint16
	}{{"api.test", 80}, {"api.test", 443}, {"other.test", 443}, {"api.test", 2222}} {
		assert.True(t, learnt.Decide(use.host, use.port).Allowed, "%s:%d, used, is not in the suggestion:\n%s", use.host, use.port, out)
	}
	assert.False(t, learnt.Decide(upstream, 80).Allowed, "an address the sandbox was refused is in the suggestion:\n%s", out)
	assert.Contains(t, out, "only attempted, left out: "+upstream, "what was refused is not reported")

	step("a stopped sidecar removes the credentials and leaves no network")
	p.sidecar.Process.Signal(os.Interrupt)
	p.sidecar.Wait()
	_, err = os.Stat(p.creds)
	assert.ErrorIs(t, err, os.ErrNotExist, "the credentials file outlived the sidecar")
	v, err := egresslog.Verify(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize)).Public().(ed25519.PublicKey), p.records)
	require.NoError(t, err)
	assert.Empty(t, v.Problems, "the sealed records")
	assert.Empty(t, v.Unsealed, "a stopped sidecar leaves its records sealed")
	assert.Positive(t, v.Sealed)
	p.writePolicy(good)
	for _, url := range []string{"http://api.test/", "http://" + upstream + "/"} {
		out, err := p.sandbox("curl", "-sS", "--max-time", "5", url)
		require.Error(t, err, "the sandbox reached %s without its sidecar: %q", url, out)
		require.NotContains(t, out, "host=", "the sandbox reached %s without its sidecar", url)
	}
}

const (
	testCredential  = "sk-test-credential-5e1d"
	testPlaceholder = "sbx-placeholder-0123456789abcdef0123"
)

func newPod(t *testing.T) *pod {
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "sidecar-test-")
	require.NoError(t, err)
	os.Chmod(dir, 0o777)
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The build directory is root's alone: give the other uids a copy.
	bin, err := os.ReadFile(self)
	require.NoError(t, err)
	copyPath := filepath.Join(dir, "sidecar")
	require.NoError(t, os.WriteFile(copyPath, bin, 0o755))
	p := &pod{t: t, dir: dir, self: copyPath}
	p.policy = filepath.Join(dir, "policy", "policy.yaml")
	os.Mkdir(filepath.Dir(p.policy), 0o755)
	p.records = filepath.Join(dir, "records.jsonl")
	p.sealKey = filepath.Join(dir, "seal.key")
	require.NoError(t, os.WriteFile(p.sealKey, bytes.Repeat([]byte{9}, ed25519.SeedSize), 0o644))
	p.webhookSecret = filepath.Join(dir, "webhook.key")
	require.NoError(t, os.WriteFile(p.webhookSecret, []byte(webhookKey), 0o644))
	p.creds = filepath.Join(dir, "creds", "credentials.yaml")
	os.Mkdir(filepath.Dir(p.creds), 0o700)
	os.Chown(filepath.Dir(p.creds), sidecarUID, sidecarUID)
	creds := fmt.Sprintf("- hosts: [api.test]\n  header: X-Api-Key\n  value: %s\n  placeholder: %s\n", testCredential, testPlaceholder)
	require.NoError(t, os.WriteFile(p.creds, []byte(creds), 0o600))
	os.Chown(p.creds, sidecarUID, sidecarUID)

	p.ns, err = netns.Add(netns.Unique("pod"))
	require.NoError(t, err)
	t.Cleanup(func() { p.ns.Delete() })
	p.in, err = netns.Add(netns.Unique("inet"))
	require.NoError(t, err)
	t.Cleanup(func() { p.in.Delete() })
	a, b := netns.Unique("vp"), netns.Unique("vi")
	require.NoError(t, netns.Veth(p.ns, a, p.in, b))
	require.NoError(t, p.ns.IP("addr", "add", "198.18.0.2/24", "dev", a))
	require.NoError(t, p.ns.IP("route", "add", "default", "via", "198.18.0.1"))
	// Like a Pod's cluster DNS: an address off the Pod, which the rules
	// redirect to the sidecar.
	require.NoError(t, p.ns.SetResolvConf("nameserver 198.18.0.53\n"))
	require.NoError(t, p.in.IP("addr", "add", "198.18.0.1/24", "dev", b))
	require.NoError(t, p.in.IP("addr", "add", upstream+"/32", "dev", "lo"))
	p.startInternet()
	return p
}

// startInternet serves DNS for *.test, and on 198.18.10.1 HTTP (:80),
// HTTPS (:443, echoing request headers) and a banner (:2222).
func (p *pod) startInternet() {
	t := p.t
	root, err := mitm.NewCA("Test Public Root")
	require.NoError(t, err)
	base := filepath.Join(p.dir, "roots.pem")
	os.WriteFile(base, root.PEM(), 0o644)
	leaves := &mitm.Leaves{CA: root}
	err = p.in.Do(func() error {
		handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			q := r.Question[0]
			switch name := strings.ToLower(q.Name); {
			case name != "api.test." && name != "other.test." && name != "third.test.":
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
			// What the server saw, said without repeating it (the gateway
			// would redact an echo), then the echo itself.
			seen := r.Header.Get("Authorization") == "Bearer "+testCredential && r.Header.Get("X-Api-Key") == testCredential
			fmt.Fprintf(w, "credential-seen=%v\n", seen)
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
		// The control plane's approval webhook: it approves other.test
		// once, and answers about anything else with a signature made
		// with the wrong key, which the sidecar must not take.
		hook := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if approval.Verify([]byte(webhookKey), approval.Asking, r.Header.Get(approval.SignatureHeader), body, time.Now(), 0) != nil {
				http.Error(w, "bad signature", http.StatusUnauthorized)
				return
			}
			var req approval.Request
			json.Unmarshal(body, &req)
			key := []byte(webhookKey)
			if req.Name != "other.test" {
				key = []byte("not-the-control-planes-key-0000")
			}
			answer, _ := json.Marshal(map[string]string{"id": req.ID, "answer": "once"})
			w.Header().Set(approval.SignatureHeader, approval.Sign(key, approval.Answering, answer, time.Now()))
			w.Write(answer)
		})
		hookLn, err := net.Listen("tcp", upstream+":8080")
		if err != nil {
			return err
		}
		hs2 := &http.Server{Handler: hook}
		go hs2.Serve(hookLn)
		t.Cleanup(func() { hs2.Close() })
		otlpLn, err := net.Listen("tcp", upstream+":4317")
		if err != nil {
			return err
		}
		p.collector = otlptest.New()
		p.collector.ServeGRPCOn(t, otlpLn)
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
	require.NoError(t, err)
	p.bundle = filepath.Join(p.dir, "bundle.pem")
	p.baseRoots = base
}

// startSidecar runs `sidecar serve` inside the Pod as uid 1337, and the
// trust step as the sandbox's uid.
func (p *pod) startSidecar() {
	t := p.t
	cmd := exec.Command("nsenter", "--net="+p.ns.Path(), "-S", fmt.Sprint(sidecarUID), "-G", fmt.Sprint(sidecarUID), p.self, "serve",
		"--policy", p.policy, "--credentials", p.creds, "--dns-upstream", "198.18.0.1:53", "--public", "198.18.0.0/15", "--log", p.records, "--upstream-roots", p.baseRoots,
		"--approval-webhook", "http://"+upstream+":8080/approve", "--approval-secret", p.webhookSecret, "--approval-timeout", "2s",
		"--log-seal", p.sealKey, "--otlp", "logs,traces,metrics", "--otlp-protocol", "grpc", "--otlp-endpoint", "http://"+upstream+":4317")
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_AS_CLI=1", "OTEL_METRIC_EXPORT_INTERVAL=200", "OTEL_BLRP_SCHEDULE_DELAY=100", "OTEL_BSP_SCHEDULE_DELAY=100")
	cmd.Stderr = os.Stderr
	stdout, _ := cmd.StdoutPipe()
	require.NoError(t, cmd.Start())
	p.sidecar = cmd
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	require.NoError(t, lifecycle.WaitReady(stdout, "sidecar: ready", 30*time.Second), "the sidecar did not get ready")
	out, err := p.as(sandboxUID, p.self, "install-ca", "--base", p.baseRoots, "--bundle", p.bundle)
	require.NoError(t, err, "install-ca: %s", out)
	out, err = p.as(sidecarUID, p.self, "install-ca", "--base", p.baseRoots, "--bundle", p.bundle+".x")
	require.Error(t, err, "install-ca as uid 1337 was not refused: %s", out)
	require.Contains(t, out, "refusing to run as uid 1337", "install-ca as uid 1337 was not refused")
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
	cmd.WaitDelay = 5 * time.Second // a killed shell's children may hold the output open
	cmd.Env = append(os.Environ(), "SIDECAR_TEST_AS_CLI=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p *pod) sandbox(name string, args ...string) (string, error) {
	return p.as(sandboxUID, name, args...)
}

func (p *pod) run(uid int, name string, args ...string) {
	p.t.Helper()
	out, err := p.as(uid, name, args...)
	require.NoError(p.t, err, "%s %v: %s", name, args, out)
}

func (p *pod) writePolicy(content string) {
	tmp := p.policy + ".tmp"
	require.NoError(p.t, os.WriteFile(tmp, []byte(content), 0o644))
	require.NoError(p.t, os.Rename(tmp, p.policy))
}

// awaitHTTP waits until plain HTTP to api.test is allowed, or denied.
func (p *pod) awaitHTTP(allowed bool) {
	p.t.Helper()
	var last atomic.Value                    // the last try's outcome, for the failure message
	if !assert.Eventually(p.t, func() bool { // the watcher applies the file within a second
		out, err := p.sandbox("curl", "-sS", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://api.test/")
		last.Store(fmt.Sprintf("%q %v", out, err))
		return (err == nil && out == "200") == allowed
	}, 10*time.Second, 100*time.Millisecond) {
		require.Failf(p.t, "timed out", "plain HTTP to api.test: %v; want allowed=%v", last.Load(), allowed)
	}
}

// dnsFailsFast checks that a lookup fails with NXDOMAIN, not a timeout.
func (p *pod) dnsFailsFast(name string) {
	p.t.Helper()
	start := time.Now()
	out, err := p.sandbox("getent", "hosts", name)
	require.Error(p.t, err, "%s resolved under deny-all: %s", name, out)
	took := time.Since(start)
	require.LessOrEqual(p.t, took, 4*time.Second, "the lookup took %v: DNS hung instead of answering NXDOMAIN", took)
}

func (p *pod) stats() map[string]int64 {
	p.t.Helper()
	out, err := p.sandbox("curl", "-sS", "--max-time", "5", "http://127.0.0.1:15004/stats")
	require.NoError(p.t, err, "stats: %s", out)
	var s struct {
		Accepted map[string]int64 `json:"accepted"`
	}
	require.NoError(p.t, json.Unmarshal([]byte(out), &s), "stats: %s", out)
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
