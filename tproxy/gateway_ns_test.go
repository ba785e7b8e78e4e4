//go:build linux

package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
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
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy/nftrules"
)

// gatewayConfig is what the gateway helper process is told.
type gatewayConfig struct {
	Allow      []string
	Links      []nftrules.Link
	Upstream   string
	Records    string
	AgentAddrs []string
}

const (
	gwDNSPort      = 15053
	gwProxyPort    = 15001
	gwExplicitPort = 15002
	gwClosedPort   = 15080 // listened on, but not one of the named ports
)

// TestGatewayHelper is not a test: it is the gateway process that
// TestGatewayInNamespaces starts inside the gateway namespace, so that
// every socket of the gateway lives there and killing it is a real crash.
func TestGatewayHelper(t *testing.T) {
	raw := os.Getenv("TPROXY_TEST_GATEWAY")
	if raw == "" {
		t.Skip("the gateway process of TestGatewayInNamespaces; not run on its own")
	}
	var cfg gatewayConfig
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: cfg.Allow})
	require.NoError(t, err)
	agents := map[netip.Addr]bool{}
	for _, a := range cfg.AgentAddrs {
		agents[netip.MustParseAddr(a)] = true
	}
	agentFunc := func(src netip.Addr) (string, *policy.Policy, bool) {
		return "sb", pol, agents[src]
	}
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{
		netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd00::/8"),
	}})
	require.NoError(t, err)
	sink, err := egresslog.OpenJSONFile(cfg.Records)
	require.NoError(t, err)
	elog := &egresslog.Log{Sinks: []egresslog.Sink{sink}}
	rules, err := nftrules.GatewayRules{
		Links: cfg.Links, DNSPort: gwDNSPort, ProxyPort: gwProxyPort, OpenPorts: []uint16{gwExplicitPort},
		AgentPools: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("198.18.3.0/24"), netip.MustParsePrefix("fd00:1::/64")},
	}.Apply()
	require.NoError(t, err)
	defer rules.Close()
	dnsSrv := &dnsfilter.Server{Agents: agentFunc, Upstreams: []string{cfg.Upstream}, Guard: guard, Log: elog}
	go dnsSrv.ListenAndServe(fmt.Sprintf(":%d", gwDNSPort))
	p := &Proxy{Agents: agentFunc, Names: dnsSrv.Names, Guard: guard, Resolver: dnsSrv, Log: elog, HelloTimeout: 2 * time.Second}
	for port, serve := range map[int]func(net.Listener) error{gwProxyPort: p.Serve, gwExplicitPort: p.ServeExplicit, gwClosedPort: serveOpen} {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		require.NoError(t, err)
		go serve(ln)
	}
	fmt.Println("READY")
	io.Copy(io.Discard, os.Stdin) // until the parent closes stdin or kills us
	p.Close()
	elog.Shutdown(context.Background())
	sink.Close()
}

func serveOpen(ln net.Listener) error {
	acceptLoop(ln, func(c net.Conn) { c.Write([]byte("open\n")); c.Close() })
	return nil
}

// nsWorld is three namespaces: a sandbox, its gateway, and an "internet"
// with real servers, all on 198.18.0.0/15 and fd00::/8.
type nsWorld struct {
	t           *testing.T
	sb, gw, in  *netns.NS
	gwIface     string
	sb2         *netns.NS // a second sandbox, on its own link, that no agent owns
	sb2Iface    string
	gwIface2    string
	ca          *testkit.CA
	caFile      string
	records     string
	gateway     *exec.Cmd
	gatewayIn   io.WriteCloser
	udpReceived atomic.Int64
}

func TestGatewayInNamespaces(t *testing.T) {
	testkit.RequireNamespaces(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("requires curl (apt-get install curl)")
	}
	w := newNSWorld(t)

	// Before the gateway: the topology really would forward, and ping.
	require.True(t, w.udpGetsThrough(), "sanity: UDP from the sandbox does not reach the internet namespace before the rules")
	require.True(t, w.ping("198.18.100.1"), "sanity: ping does not reach the internet namespace before the rules")

	w.startGateway([]string{"api.test", "www.test", "*.wild.test", "ssh.test:22", "meta.test"})

	step(t, "allowed HTTPS", func() {
		for _, family := range []string{"-4", "-6"} {
			out, err := w.curl(family, "https://api.test/")
			require.NoError(t, err, "curl %s: %q", family, out)
			require.Contains(t, out, "api.test", "curl %s", family)
		}
		out, err := w.goHTTPS("api.test")
		require.NoError(t, err, "Go client: %q", out)
		require.Contains(t, out, " api.test", "Go client")
	})
	step(t, "allowed HTTP", func() {
		out, err := w.curl("http://www.test/")
		require.NoError(t, err, "curl: %q", out)
		require.Contains(t, out, "www.test", "curl")
	})
	step(t, "denied name", func() {
		_, err := w.curl("https://other.test/")
		require.Error(t, err, "a denied name resolved")
		w.waitRecord(func(r egresslog.Record) bool {
			return r.Kind == egresslog.KindDNS && r.Host == "other.test" && !r.Allowed && r.Reason == policy.ReasonNoRule
		})
		// Even with an address from elsewhere, the connection is refused.
		_, err = w.curl("--resolve", "other.test:443:198.18.100.5", "https://other.test/")
		require.Error(t, err, "a denied name was reached through a known address")
		w.waitRecord(func(r egresslog.Record) bool {
			return r.Kind == egresslog.KindTLS && r.Host == "other.test" && !r.Allowed && r.Reason == policy.ReasonNoRule
		})
	})
	step(t, "wildcard", func() {
		out, err := w.curl("https://sub.wild.test/")
		require.NoError(t, err, "subdomain: %q", out)
		require.Contains(t, out, "sub.wild.test", "subdomain")
		_, err = w.curl("--resolve", "wild.test:443:198.18.100.4", "https://wild.test/")
		require.Error(t, err, "the apex of a wildcard was allowed")
	})
	step(t, "forged SNI", func() {
		out, err := w.curl("--resolve", "api.test:443:198.18.100.5", "https://api.test/")
		require.NoError(t, err, "a forged address reached %q; want api.test's own address", out)
		require.True(t, strings.HasPrefix(out, "198.18.100.1:443"), "a forged address reached %q; want api.test's own address", out)
	})
	step(t, "each request judged", func() {
		c := w.dialFromSandbox("198.18.100.2:80")
		defer c.Close()
		br := bufio.NewReader(c)
		for i, tc := range []struct {
			host   string
			status int
		}{{"www.test", 200}, {"other.test", 403}, {"www.test", 200}} {
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", tc.host)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "request %d", i)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			require.Equal(t, tc.status, resp.StatusCode, "request %d for %s", i, tc.host)
		}
	})
	step(t, "other TCP by resolved name", func() {
		require.Equal(t, netip.MustParseAddr("198.18.100.3"), w.lookupInSandbox("ssh.test"), "what ssh.test resolved to")
		c := w.dialFromSandbox("198.18.100.3:22")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		require.NoError(t, err, "banner: %q", line)
		require.True(t, strings.HasPrefix(line, "SSH-2.0"), "banner: %q", line)
		// The same service at an address never looked up is refused.
		c = w.dialFromSandbox("198.18.100.6:22")
		c.SetReadDeadline(time.Now().Add(15 * time.Second))
		_, err = c.Read(make([]byte, 1))
		require.Error(t, err, "other TCP without a lookup got data")
		c.Close()
	})
	step(t, "never tier refused at dial", func() {
		_, err := w.curl("--resolve", "meta.test:443:198.18.100.1", "https://meta.test/")
		require.Error(t, err, "reached a name that resolves to the metadata address")
		w.waitRecord(func(r egresslog.Record) bool {
			return r.Host == "meta.test" && r.Kind == egresslog.KindTLS && strings.Contains(r.Reason, "metadata")
		})
	})
	step(t, "UDP and ICMP dropped", func() {
		require.False(t, w.udpGetsThrough(), "UDP from the sandbox reached the internet")
		require.False(t, w.ping("198.18.100.1"), "ICMP from the sandbox reached the internet")
		require.False(t, w.ping("198.18.1.2"), "the gateway answered ICMP")
	})
	step(t, "only the named gateway ports", func() {
		c := w.dialFromSandbox(fmt.Sprintf("198.18.1.2:%d", gwExplicitPort))
		c.Close()
		closed, err := w.tryDialFromSandbox(fmt.Sprintf("198.18.1.2:%d", gwClosedPort), time.Second)
		if err == nil {
			closed.Close()
		}
		require.Error(t, err, "a gateway port that is not named answered")
	})
	step(t, "explicit proxy", func() {
		proxy := fmt.Sprintf("http://198.18.1.2:%d", gwExplicitPort)
		out, err := w.curl("-x", proxy, "https://api.test/")
		require.NoError(t, err, "CONNECT to an allowed name: %q", out)
		require.Contains(t, out, "api.test", "CONNECT to an allowed name")
		out, err = w.curl("-x", proxy, "http://www.test/")
		require.NoError(t, err, "absolute-form to an allowed name: %q", out)
		require.Contains(t, out, "www.test", "absolute-form to an allowed name")
		_, err = w.curl("-x", proxy, "https://other.test/")
		require.Error(t, err, "CONNECT to a denied name succeeded")
		w.waitRecord(func(r egresslog.Record) bool {
			return r.Kind == egresslog.KindConnect && r.Host == "other.test" && !r.Allowed
		})
	})
	step(t, "a spoofed agent address is dropped before anything judges it", func() {
		// The second sandbox takes the first one's address and sends a
		// DNS query from it: it needs no answer for the name to leak.
		require.NoError(t, w.sb2.IP("addr", "add", "198.18.1.10/32", "dev", w.sb2Iface))
		spoofed := fmt.Sprintf("spoofed-%d.wild.test", time.Now().UnixNano())
		w.sendDNS(w.sb2, "198.18.1.10", spoofed)
		// A query from the real sandbox, recorded after the spoofed one
		// would have been.
		real := fmt.Sprintf("real-%d.wild.test", time.Now().UnixNano())
		w.sendDNS(w.sb, "198.18.1.10", real)
		w.waitRecord(func(r egresslog.Record) bool { return r.Host == real })
		data, _ := os.ReadFile(w.records)
		require.NotContains(t, string(data), spoofed, "a query from a spoofed agent address was served")
	})
	step(t, "the uplink side reaches neither the DNS nor the proxies", func() {
		outsider := fmt.Sprintf("outsider-%d.wild.test", time.Now().UnixNano())
		w.sendDNSTo(w.in, "198.18.2.1", fmt.Sprintf("198.18.2.2:%d", gwDNSPort), outsider)
		for _, port := range []int{gwDNSPort, gwProxyPort, gwExplicitPort} {
			c, err := dialIn(w.in, fmt.Sprintf("198.18.2.2:%d", port), time.Second)
			if err == nil {
				c.Close()
			}
			assert.Error(t, err, "the uplink side connected to gateway port %d", port)
		}
		// A packet from an agent's address arrives only on the agent's
		// link: from the uplink it reaches not even a port the rules
		// leave open, while the same packet from the uplink's own
		// address does.
		probe := w.listenUDPInGateway(gwClosedPort)
		require.NoError(t, w.in.IP("addr", "add", "198.18.1.10/32", "dev", "lo"))
		w.sendUDP(w.in, "198.18.1.10", fmt.Sprintf("198.18.2.2:%d", gwClosedPort), "spoofed")
		w.sendUDP(w.in, "198.18.2.1", fmt.Sprintf("198.18.2.2:%d", gwClosedPort), "plain")
		require.NoError(t, w.in.IP("addr", "del", "198.18.1.10/32", "dev", "lo"))
		assert.Equal(t, []string{"plain"}, probe(), "what reached the gateway from the uplink side")
		marker := fmt.Sprintf("after-%d.wild.test", time.Now().UnixNano())
		w.sendDNS(w.sb, "198.18.1.10", marker)
		w.waitRecord(func(r egresslog.Record) bool { return r.Host == marker })
		data, _ := os.ReadFile(w.records)
		assert.NotContains(t, string(data), outsider, "a query from the uplink side was served")
	})
	step(t, "killed gateway leaves no network", func() {
		w.gateway.Process.Kill()
		w.gateway.Wait()
		_, err := w.curl("--resolve", "api.test:443:198.18.100.1", "https://api.test/")
		require.Error(t, err, "the sandbox reached the internet after the gateway died")
		require.False(t, w.udpGetsThrough(), "UDP got through after the gateway died")
		require.False(t, w.ping("198.18.100.1"), "ICMP got through after the gateway died")
	})
}

// step runs one part of a long test; the helpers of nsWorld fail the
// whole test, so the parts are not subtests.
func step(t *testing.T, name string, f func()) {
	t.Helper()
	t.Logf("step: %s", name)
	f()
}

func newNSWorld(t *testing.T) *nsWorld {
	w := &nsWorld{t: t, sb: testkit.NewNS(t, "sb"), gw: testkit.NewNS(t, "gw"), in: testkit.NewNS(t, "in"), sb2: testkit.NewNS(t, "sbb")}
	sbIf := netns.Unique("vs")
	w.gwIface = netns.Unique("vg")
	gwUp, inIf := netns.Unique("vu"), netns.Unique("vi")
	must := func(err error) {
		t.Helper()
		require.NoError(t, err)
	}
	must(netns.Veth(w.sb, sbIf, w.gw, w.gwIface))
	w.sb2Iface, w.gwIface2 = netns.Unique("vt"), netns.Unique("vh")
	must(netns.Veth(w.sb2, w.sb2Iface, w.gw, w.gwIface2))
	must(netns.Veth(w.gw, gwUp, w.in, inIf))
	for _, c := range [][]string{
		{"sb", "addr", "add", "198.18.1.10/24", "dev", sbIf},
		{"sb", "addr", "add", "fd00:1::10/64", "dev", sbIf, "nodad"},
		{"sb", "route", "add", "default", "via", "198.18.1.2"},
		{"sb", "-6", "route", "add", "default", "via", "fd00:1::2"},
		{"gw", "addr", "add", "198.18.1.2/24", "dev", w.gwIface},
		{"gw", "addr", "add", "198.18.3.2/24", "dev", w.gwIface2},
		{"sbb", "addr", "add", "198.18.3.10/24", "dev", w.sb2Iface},
		{"sbb", "route", "add", "default", "via", "198.18.3.2"},
		{"gw", "addr", "add", "fd00:1::2/64", "dev", w.gwIface, "nodad"},
		{"gw", "addr", "add", "198.18.2.2/24", "dev", gwUp},
		{"gw", "addr", "add", "fd00:2::2/64", "dev", gwUp, "nodad"},
		{"gw", "route", "add", "198.18.100.0/24", "via", "198.18.2.1"},
		{"gw", "-6", "route", "add", "fd00:100::/64", "via", "fd00:2::1"},
		{"in", "addr", "add", "198.18.2.1/24", "dev", inIf},
		{"in", "addr", "add", "fd00:2::1/64", "dev", inIf, "nodad"},
		{"in", "route", "add", "198.18.1.0/24", "via", "198.18.2.2"},
		{"in", "-6", "route", "add", "fd00:1::/64", "via", "fd00:2::2"},
	} {
		ns := map[string]*netns.NS{"sb": w.sb, "sbb": w.sb2, "gw": w.gw, "in": w.in}[c[0]]
		must(ns.IP(c[1:]...))
	}
	for i := 1; i <= 6; i++ {
		must(w.in.IP("addr", "add", fmt.Sprintf("198.18.100.%d/32", i), "dev", "lo"))
		must(w.in.IP("addr", "add", fmt.Sprintf("fd00:100::%d/128", i), "dev", "lo"))
	}
	// Forwarding on: the rules, not a sysctl, must stop the sandbox.
	must(w.gw.Sysctl("net.ipv4.ip_forward=1"))
	must(w.gw.Sysctl("net.ipv6.conf.all.forwarding=1"))
	must(w.sb.SetResolvConf("nameserver 198.18.1.2\n"))
	w.startInternet()
	return w
}

// startInternet runs, inside the internet namespace, an authoritative DNS
// server for "test." and the services the sandbox tries to reach.
func (w *nsWorld) startInternet() {
	t := w.t
	ca := testkit.NewCA(t)
	w.ca = ca
	w.caFile = filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(w.caFile, ca.PEM(), 0o644))
	ip := netip.MustParseAddr
	zone := testkit.Zone{
		"api.test": {ip("198.18.100.1"), ip("fd00:100::1")}, "www.test": {ip("198.18.100.2")}, "ssh.test": {ip("198.18.100.3")},
		"sub.wild.test": {ip("198.18.100.4")}, "wild.test": {ip("198.18.100.4")}, "other.test": {ip("198.18.100.5")},
		"meta.test": {ip("169.254.169.254")},
	}
	err := w.in.Do(func() error {
		// Sockets are made here, on the namespace's thread; the servers
		// run on any.
		pc, err := net.ListenPacket("udp", "198.18.2.1:53")
		if err != nil {
			return err
		}
		tcpLn, err := net.Listen("tcp", "198.18.2.1:53")
		if err != nil {
			return err
		}
		testkit.ServeDNS(t, zone, pc, tcpLn)
		https := func(addr string, names ...string) error {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			srv := &http.Server{
				Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
					fmt.Fprintf(rw, "%s %s\n", r.Context().Value(http.LocalAddrContextKey), r.Host)
				}),
				TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, names...)}},
				ErrorLog:  log.New(io.Discard, "", 0),
			}
			go srv.ServeTLS(ln, "", "")
			t.Cleanup(func() { srv.Close() })
			return nil
		}
		for _, s := range []struct {
			addr  string
			names []string
		}{
			{"198.18.100.1:443", []string{"api.test", "meta.test"}},
			{"[fd00:100::1]:443", []string{"api.test"}},
			{"198.18.100.4:443", []string{"sub.wild.test", "wild.test"}},
			{"198.18.100.5:443", []string{"api.test", "other.test"}}, // the impostor
		} {
			if err := https(s.addr, s.names...); err != nil {
				return err
			}
		}
		plain, err := net.Listen("tcp", "198.18.100.2:80")
		if err != nil {
			return err
		}
		plainSrv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "%s %s\n", r.Context().Value(http.LocalAddrContextKey), r.Host)
		})}
		go plainSrv.Serve(plain)
		t.Cleanup(func() { plainSrv.Close() })
		for _, addr := range []string{"198.18.100.3:22", "198.18.100.6:22"} {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			go acceptLoop(ln, func(c net.Conn) { c.Write([]byte("SSH-2.0-internet\r\n")); time.Sleep(time.Second); c.Close() })
		}
		udp, err := net.ListenPacket("udp", "198.18.100.1:9999")
		if err != nil {
			return err
		}
		t.Cleanup(func() { udp.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				if _, _, err := udp.ReadFrom(buf); err != nil {
					return
				}
				w.udpReceived.Add(1)
			}
		}()
		return nil
	})
	require.NoError(t, err)
}

// startGateway starts the gateway process in the gateway namespace.
func (w *nsWorld) startGateway(allow []string) {
	t := w.t
	w.records = filepath.Join(t.TempDir(), "records.jsonl")
	cfg, _ := json.Marshal(gatewayConfig{
		Allow: allow, Upstream: "198.18.2.1:53", Records: w.records,
		Links: []nftrules.Link{
			{Interface: w.gwIface, Addrs: []netip.Addr{netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("fd00:1::10")}},
			{Interface: w.gwIface2, Addrs: []netip.Addr{netip.MustParseAddr("198.18.3.10")}},
		},
		AgentAddrs: []string{"198.18.1.10", "fd00:1::10"},
	})
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := w.gw.Command(context.Background(), exe, "-test.run=^TestGatewayHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TPROXY_TEST_GATEWAY="+string(cfg))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	w.gatewayIn, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	w.gateway = cmd
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	require.NoError(t, lifecycle.WaitReady(stdout, "READY", 30*time.Second), "the gateway process did not get ready")
}

func (w *nsWorld) curl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := []string{"-sS", "--max-time", "8", "--cacert", w.caFile}
	return w.sb.Run(ctx, "curl", append(base, args...)...)
}

// goHTTPS fetches https://host/ with the Go client from the sandbox.
func (w *nsWorld) goHTTPS(host string) (string, error) {
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: w.ca.Pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			ip := w.lookupInSandbox(host)
			if !ip.IsValid() { // the lookup failed the test already
				return nil, fmt.Errorf("no address for %s in the sandbox", host)
			}
			return w.tryDialFromSandbox(net.JoinHostPort(ip.String(), port), 5*time.Second)
		},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + host + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func (w *nsWorld) tryDialFromSandbox(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := w.sb.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	return c, err
}

// dialIn dials TCP addr from inside ns.
func dialIn(ns *netns.NS, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	return c, err
}

func (w *nsWorld) dialFromSandbox(addr string) net.Conn {
	w.t.Helper()
	c, err := w.tryDialFromSandbox(addr, 5*time.Second)
	require.NoError(w.t, err, "dial %s from the sandbox", addr)
	return c
}

// lookupInSandbox asks the sandbox's DNS server (the gateway's address,
// redirected to dnsfilter) for name's A record, from a socket inside the
// sandbox. (Go's resolver would query from other threads, outside it.)
// goHTTPS calls it on its transport's dialing goroutine, where FailNow must
// not run: a failure is reported with assert and returns the zero Addr.
func (w *nsWorld) lookupInSandbox(name string) netip.Addr {
	w.t.Helper()
	var conn net.Conn
	if !assert.NoError(w.t, w.sb.Do(func() error {
		var err error
		conn, err = net.Dial("udp", "198.18.1.2:53")
		return err
	})) {
		return netip.Addr{}
	}
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c := &dns.Client{Timeout: 5 * time.Second}
	resp, _, err := c.ExchangeWithConn(m, &dns.Conn{Conn: conn})
	if !assert.NoError(w.t, err, "resolve %s in the sandbox", name) {
		return netip.Addr{}
	}
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A)
			return ip.Unmap()
		}
	}
	assert.Failf(w.t, "no address", "resolve %s in the sandbox: rcode %d", name, resp.Rcode)
	return netip.Addr{}
}

// sendDNS sends one DNS query for name from src, inside ns, to the
// gateway's address on the first sandbox's link.
func (w *nsWorld) sendDNS(ns *netns.NS, src, name string) {
	w.sendDNSTo(ns, src, "198.18.1.2:53", name)
}

// sendDNSTo sends one DNS query for name from src, inside ns, to dst.
func (w *nsWorld) sendDNSTo(ns *netns.NS, src, dst, name string) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	packet, _ := m.Pack()
	w.sendUDP(ns, src, dst, string(packet))
}

// sendUDP sends one datagram from src, inside ns, to dst.
func (w *nsWorld) sendUDP(ns *netns.NS, src, dst, payload string) {
	err := ns.Do(func() error {
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(src)}, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	require.NoError(w.t, err)
}

// listenUDPInGateway listens on a UDP port in the gateway namespace and
// returns a function that, after a second, returns what arrived.
func (w *nsWorld) listenUDPInGateway(port int) func() []string {
	var pc net.PacketConn
	require.NoError(w.t, w.gw.Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		return err
	}))
	return func() []string {
		defer pc.Close()
		var got []string
		buf := make([]byte, 1500)
		pc.SetReadDeadline(time.Now().Add(time.Second))
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return got
			}
			got = append(got, string(buf[:n]))
		}
	}
}

// udpGetsThrough sends UDP from the sandbox to the internet namespace and
// reports whether any arrived within a second.
func (w *nsWorld) udpGetsThrough() bool {
	before := w.udpReceived.Load()
	c, err := w.tryDialUDP("198.18.100.1:9999")
	if err != nil {
		return false
	}
	defer c.Close()
	for i := 0; i < 10; i++ {
		c.Write([]byte("hello"))
		time.Sleep(100 * time.Millisecond) // spread the packets over a second
		if w.udpReceived.Load() > before {
			return true
		}
	}
	return false
}

func (w *nsWorld) tryDialUDP(addr string) (net.Conn, error) {
	var c net.Conn
	err := w.sb.Do(func() error {
		var err error
		c, err = net.Dial("udp", addr)
		return err
	})
	return c, err
}

// ping sends ICMP echo requests from the sandbox and reports whether one
// was answered within a second.
func (w *nsWorld) ping(addr string) bool {
	var conn *icmp.PacketConn
	require.NoError(w.t, w.sb.Do(func() error {
		var err error
		conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}))
	defer conn.Close()
	msg, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("ping")}}).Marshal(nil)
	dst := &net.IPAddr{IP: net.ParseIP(addr)}
	conn.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := conn.WriteTo(msg, dst); err != nil {
		return false
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return false
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err == nil && m.Type == ipv4.ICMPTypeEchoReply && from.String() == addr {
			return true
		}
	}
}

// waitRecord waits for the gateway process to write a matching record.
func (w *nsWorld) waitRecord(f func(egresslog.Record) bool) {
	w.t.Helper()
	var have atomic.Value // the records read last, for the failure message
	found := func() bool {
		data, _ := os.ReadFile(w.records) // written by another process
		have.Store(string(data))
		for _, line := range strings.Split(string(data), "\n") {
			if r, err := egresslog.ParseJSON([]byte(line)); err == nil && f(r) {
				return true
			}
		}
		return false
	}
	if !assert.Eventually(w.t, found, 10*time.Second, 50*time.Millisecond) {
		require.Failf(w.t, "no matching record", "among:\n%v", have.Load())
	}
}
