//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/egresslog/otlp"
	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
	"github.com/agenthold/egress/policy/policyfile"
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/tproxy/fastpath"
	"github.com/agenthold/egress/tproxy/nftrules"
)

// ports are the sidecar's ports, shared by rules and serve.
type ports struct {
	dns, http, tls, other, health uint16
	exemptUID                     uint
}

func (p *ports) flags(fs *flag.FlagSet, withHealth bool) {
	fs.Func("dns", "DNS port (15053)", portFlag(&p.dns))
	fs.Func("http", "port for TCP to :80 (15001)", portFlag(&p.http))
	fs.Func("tls", "port for TCP to :443 (15002)", portFlag(&p.tls))
	fs.Func("other", "port for other TCP (15003)", portFlag(&p.other))
	if withHealth {
		fs.Func("health", "health port (15004)", portFlag(&p.health))
	}
	fs.UintVar(&p.exemptUID, "exempt-uid", 1337, "the sidecar's uid, exempt from the redirect")
}

func defaultPorts() ports {
	return ports{dns: 15053, http: 15001, tls: 15002, other: 15003, health: 15004, exemptUID: 1337}
}

func portFlag(p *uint16) func(string) error {
	return func(s string) error {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("%q is not a port", s)
		}
		*p = uint16(n)
		return nil
	}
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Printf("Flags of sidecar %s:\n", fs.Name())
		fs.SetOutput(os.Stdout)
		fs.PrintDefaults()
		return errHelpShown
	} else if err != nil {
		return usageError{fmt.Sprintf("%s: %v", fs.Name(), err)}
	}
	if fs.NArg() != 0 {
		return usageError{fmt.Sprintf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return nil
}

// cmdRules installs the sidecar-mode redirect in this network namespace
// and exits, leaving the rules for the Pod's lifetime.
func cmdRules(args []string) error {
	p := defaultPorts()
	fs := flag.NewFlagSet("rules", flag.ContinueOnError)
	p.flags(fs, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if p.exemptUID == 0 {
		return usageError{"--exempt-uid 0 would exempt root"}
	}
	_, err := nftrules.SidecarRules{
		Table: "egress_sidecar", ExemptUID: uint32(p.exemptUID),
		DNSPort: p.dns, HTTPPort: p.http, TLSPort: p.tls, OtherPort: p.other,
	}.Apply()
	if err != nil {
		return fmt.Errorf("install rules (needs CAP_NET_ADMIN): %w", err)
	}
	fmt.Printf("sidecar rules installed: :80 -> %d, :443 -> %d, other TCP -> %d, DNS -> %d; uid %d exempt\n", p.http, p.tls, p.other, p.dns, p.exemptUID)
	return nil
}

// cmdServe runs the filter until SIGTERM.
func cmdServe(args []string) error {
	p := defaultPorts()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	p.flags(fs, true)
	policyPath := fs.String("policy", "", "the policy file (required)")
	credPath := fs.String("credentials", "", "the credentials file on the sidecar's tmpfs")
	upstream := fs.String("dns-upstream", "", "DNS upstream host:port (default: /etc/resolv.conf)")
	logPath := fs.String("log", "", "also write records as JSON lines to this file, rotated by size")
	logMaxMB := fs.Int("log-max-mb", egresslog.DefaultMaxFileBytes>>20, "rotate --log at this many MiB")
	logFiles := fs.Int("log-files", egresslog.DefaultKeepFiles, "rotated --log files kept (FILE.1 to FILE.N)")
	logMaxAge := fs.Duration("log-max-age", 0, "also rotate --log once its first record is this old (0: by size only)")
	otlpSignals := fs.String("otlp", "", "send these signals to an OpenTelemetry collector: logs (every record), traces (a span per HTTP request judged), metrics (the counters), comma-separated")
	otlpProtocol := fs.String("otlp-protocol", "", "grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf)")
	otlpEndpoint := fs.String("otlp-endpoint", "", "the collector's base URL, http://collector:4318 (default: OTEL_EXPORTER_OTLP_ENDPOINT); headers from OTEL_EXPORTER_OTLP_HEADERS")
	logSeal := fs.String("log-seal", "", "an Ed25519 seed file (32 bytes) that chains and seals --log as an audit trail (egresslog.Verify)")
	rootsPath := fs.String("upstream-roots", "", "a PEM file of roots trusted for upstream servers besides the system's")
	tunnelling := fs.String("dns-tunnelling", "record", "lookups that look like DNS tunnelling: record, or refuse")
	webhook := fs.String("approval-webhook", "", "under a policy with mode: ask, the control plane's URL asked about each destination no entry allows")
	webhookSecret := fs.String("approval-secret", "", "the file holding the webhook's HMAC key (required with --approval-webhook)")
	approvalTimeout := fs.Duration("approval-timeout", approval.DefaultTimeout, "how long a destination waits for the webhook's answer before it is refused")
	kernelPath := fs.String("kernel-path", "off", "on: ask for the kernel path (a BPF sockmap), off for now (fastpath.ErrSockmapDefect: the log says so); off: splice in user space")
	var public []netip.Prefix
	fs.Func("public", "a prefix netguard counts as public (repeatable)", func(s string) error {
		pr, err := netip.ParsePrefix(s)
		public = append(public, pr)
		return err
	})
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *policyPath == "" {
		return usageError{"serve needs --policy FILE"}
	}
	if *kernelPath != "on" && *kernelPath != "off" {
		return usageError{fmt.Sprintf("--kernel-path must be on or off, not %q", *kernelPath)}
	}
	if *tunnelling != "record" && *tunnelling != "refuse" {
		return usageError{fmt.Sprintf("--dns-tunnelling must be record or refuse, not %q", *tunnelling)}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	roots, err := upstreamRoots(*rootsPath)
	if err != nil {
		return err
	}
	tunnel := dnsfilter.TunnelDetection{Refuse: *tunnelling == "refuse"}
	approvals, err := sidecarApprovals(*webhook, *webhookSecret, *approvalTimeout)
	if err != nil {
		return err
	}
	telemetry, err := parseTelemetry(*otlpSignals, otlp.Settings{Protocol: *otlpProtocol, Endpoint: *otlpEndpoint, ServiceName: "egress-sidecar"})
	if err != nil {
		return err
	}
	logFile := egresslog.JSONFile{Path: *logPath, MaxBytes: int64(*logMaxMB) << 20, Keep: *logFiles, MaxAge: *logMaxAge}
	if *logSeal != "" {
		seed, err := os.ReadFile(*logSeal)
		if err != nil || len(seed) != ed25519.SeedSize {
			return fmt.Errorf("--log-seal: want a file of an Ed25519 seed (%d bytes): %v", ed25519.SeedSize, err)
		}
		logFile.Seal = ed25519.NewKeyFromSeed(seed)
	}
	sc, err := startSidecar(ctx, p, *policyPath, *credPath, *upstream, logFile, telemetry, public, roots, tunnel, approvals, *kernelPath == "on", logger)
	if err != nil {
		return err
	}
	fmt.Println("sidecar: ready")
	<-sc.servers.Context().Done() // SIGTERM, or a server failed
	if err := sc.servers.StopAndWait(drainTimeout); err != nil {
		return fmt.Errorf("sidecar stopped: %w", err)
	}
	return nil
}

// sidecar is the running filter.
type sidecar struct {
	watch *policyfile.Watcher
	dns   *dnsfilter.Server
	proxy *tproxy.Proxy
	// serving is the proxy once it serves, for the policy watcher, which
	// starts before it: a new policy ends what it no longer allows.
	serving  atomic.Pointer[tproxy.Proxy]
	ic       *mitm.Interceptor
	log      *egresslog.Log
	accepted map[uint16]*atomic.Int64 // connections accepted per port
	// servers runs every server and stops them, last started first.
	servers *lifecycle.Group
}

// upstreamRoots is the system's roots plus those in path, or nil (the
// system's) when path is empty.
func upstreamRoots(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(path)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--upstream-roots: no certificate in %s", path)
	}
	return pool, nil
}

func startSidecar(ctx context.Context, p ports, policyPath, credPath, upstream string, logFile egresslog.JSONFile, telemetry telemetry, public []netip.Prefix, roots *x509.CertPool, tunnel dnsfilter.TunnelDetection, approvals *approval.Broker, kernelPath bool, logger *slog.Logger) (sc *sidecar, err error) {
	sc = &sidecar{accepted: map[uint16]*atomic.Int64{}, servers: lifecycle.New(ctx)}
	defer func() {
		if err != nil {
			sc.servers.Stop(context.Background())
		}
	}()
	// Removing the credentials file releases the sandbox: the last step.
	sc.servers.OnStop("credentials file", func(context.Context) error { return removeIfPresent(credPath) })
	rejudge := func(*policy.Policy, error) {
		if p := sc.serving.Load(); p != nil {
			p.Rejudge(sandboxAgent)
		}
	}
	if sc.watch, err = policyfile.Watch(policyPath, policyfile.WatchConfig{Logger: logger, OnLoad: rejudge}); err != nil {
		return sc, err
	}
	sc.servers.OnStop("policy watcher", lifecycle.Closing(sc.watch))
	creds, n, err := loadCredentials(credPath)
	if err != nil {
		return sc, err
	}
	ca, err := mitm.NewCA("egress sidecar CA") // per sandbox, in memory only
	if err != nil {
		return sc, err
	}
	guard, err := netguard.New(netguard.Config{Public: public})
	if err != nil {
		return sc, err
	}
	// The Pod's own addresses are never dialled, those it gains while
	// the sidecar runs too; without them known it does not start.
	follow, stopFollowing := context.WithCancel(context.Background())
	sc.servers.OnStop("own addresses", func(context.Context) error { stopFollowing(); return nil })
	if err := guard.FollowLocal(follow); err != nil {
		return sc, err
	}
	sc.log = &egresslog.Log{}
	if logFile.Path != "" {
		sink, err := logFile.Open()
		if err != nil {
			return sc, err
		}
		sc.log.Sinks = []egresslog.Sink{sink, egresslog.SlogSink{Logger: logger}}
	}
	if err := telemetry.start(ctx, sc.log, sc.servers, logger); err != nil {
		return sc, err
	}
	sc.servers.OnStop("egress log", lifecycle.WithOwnTime(logWriteOut, sc.log.Shutdown)) // closes the file too
	// Everything in the Pod is the sandbox; its policy is the file's.
	agents := func(netip.Addr) (string, *policy.Policy, bool) { return sandboxAgent, sc.watch.Policy(), true }
	var upstreams []string
	if upstream != "" {
		upstreams = []string{upstream}
	}
	approvals.Log, approvals.Logger = sc.log, logger
	sc.dns = &dnsfilter.Server{Agents: agents, Upstreams: upstreams, Guard: guard, Log: sc.log, Logger: logger, Tunnel: tunnel, Approver: approvals}
	sc.servers.OnStop("dns", sc.dns.Shutdown)
	sc.ic = &mitm.Interceptor{Leaves: &mitm.Leaves{CA: ca}, Claim: creds.Covers, Injector: creds, Guard: guard, Resolver: sc.dns, RootCAs: roots, Log: sc.log, Logger: logger}
	creds.SetTokenClient(sc.ic.Client(false)) // GitHub App tokens go out as intercepted requests do
	sc.servers.OnStop("upstream pools", func(context.Context) error { sc.ic.CloseIdleConnections(); return nil })
	sc.proxy = &tproxy.Proxy{Agents: agents, Names: sc.dns.Names, Guard: guard, Resolver: sc.dns, Interceptor: sc.ic, Log: sc.log, Logger: logger, Approver: approvals}
	if kernelPath {
		if kp, err := fastpath.New(tproxy.DefaultMaxConns); err != nil {
			logger.Warn("kernel path unavailable: connections are relayed in user space", "err", err)
		} else {
			sc.proxy.KernelPath = kp
			sc.servers.OnStop("kernel path", lifecycle.Closing(kp)) // closed after the proxy has drained
			logger.Info("kernel path on: passed-through connections move between their sockets in the kernel")
		}
	}
	sc.serving.Store(sc.proxy)
	sc.servers.OnStop("proxy", sc.proxy.Shutdown)
	sc.servers.OnStop("approvals", lifecycle.Closing(approvals)) // before the servers drain: nothing waits on an answer

	// The DNS and proxy ports listen on loopback only: the rules redirect
	// the Pod's own traffic there, and nothing outside the Pod reaches
	// them. The health port listens on every address, for the kubelet.
	for _, host := range loopbacks(logger) {
		addr := func(port uint16) string { return net.JoinHostPort(host, strconv.Itoa(int(port))) }
		pc, err := net.ListenPacket("udp", addr(p.dns))
		if err != nil {
			return sc, err
		}
		ln, err := net.Listen("tcp", addr(p.dns))
		if err != nil {
			pc.Close()
			return sc, err
		}
		sc.servers.Go("dns "+host, func() error { return sc.dns.Serve(pc, ln) }, dnsfilter.ErrServerClosed)
		for _, port := range []uint16{p.http, p.tls, p.other} {
			ln, err := tproxy.Listen("tcp", addr(port))
			if err != nil {
				return sc, err
			}
			count := sc.accepted[port]
			if count == nil {
				count = new(atomic.Int64)
				sc.accepted[port] = count
			}
			sc.servers.Go(fmt.Sprintf("proxy %s", addr(port)), func() error { return sc.proxy.Serve(&countingListener{Listener: ln, n: count}) }, tproxy.ErrServerClosed)
		}
	}
	if err := sc.serveHealth(net.JoinHostPort("::", strconv.Itoa(int(p.health))), ca); err != nil {
		return sc, err
	}
	logger.Info("sidecar serving", "policy", policyPath, "credentials", n, "dns", p.dns, "http", p.http, "tls", p.tls, "other", p.other, "health", p.health)
	return sc, nil
}

// sidecarApprovals is the broker a policy in ask mode holds destinations
// in: asked through the control plane's webhook, when one is set, and
// refused at the timeout. An "always" answer is the control plane's to
// keep: it writes the entry into the policy file it owns, which the
// watcher applies; until then the answer holds as a once does.
func sidecarApprovals(url, secretPath string, timeout time.Duration) (*approval.Broker, error) {
	b := &approval.Broker{Timeout: timeout, OnAlways: func(string, string) error { return nil }}
	if (url == "") != (secretPath == "") {
		return nil, usageError{"--approval-webhook and --approval-secret go together"}
	}
	if url == "" {
		return b, nil
	}
	secret, err := os.ReadFile(secretPath)
	if err != nil {
		return nil, fmt.Errorf("--approval-secret: %w", err)
	}
	if secret = bytes.TrimSpace(secret); len(secret) < 16 {
		return nil, errors.New("--approval-secret: the secret is shorter than 16 bytes")
	}
	b.Webhook = &approval.Webhook{URL: url, Secret: secret}
	return b, nil
}

// loopbacks are the loopback addresses to listen on: 127.0.0.1, and ::1
// unless the Pod has no IPv6 (then it has no IPv6 traffic to redirect).
func loopbacks(logger *slog.Logger) []string {
	ln, err := net.ListenPacket("udp", "[::1]:0")
	if err != nil {
		logger.Warn("no IPv6 loopback; serving IPv4 only", "err", err)
		return []string{"127.0.0.1"}
	}
	ln.Close()
	return []string{"127.0.0.1", "::1"}
}

// removeIfPresent removes path; that it is already gone is no error.
func removeIfPresent(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// serveHealth serves the health port: /healthz, the CA for the sandbox's
// trust store, and accept counts per port. It is not a data-plane port:
// nothing here is judged by the policy or logged as a denial.
func (sc *sidecar) serveHealth(addr string, ca *mitm.CA) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		w.Write(ca.PEM())
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		out := map[string]int64{}
		for port, n := range sc.accepted {
			out[strconv.Itoa(int(port))] = n.Load()
		}
		json.NewEncoder(w).Encode(map[string]any{"accepted": out})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	sc.servers.Go("health", func() error { return srv.Serve(ln) }, http.ErrServerClosed)
	sc.servers.OnStop("health", srv.Shutdown)
	return nil
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// cmdInstallCA writes the sandbox's CA bundle: its base bundle of system
// roots followed by the sidecar's CA. It refuses to run as the exempt
// uid, whose traffic would bypass the filter.
func cmdInstallCA(args []string) error {
	fs := flag.NewFlagSet("install-ca", flag.ContinueOnError)
	from := fs.String("from", "http://127.0.0.1:15004/ca.pem", "where the sidecar serves its CA")
	base := fs.String("base", "/etc/ssl/certs/ca-certificates.crt", "the system bundle to extend")
	out := fs.String("bundle", "", "where to write the bundle (required)")
	exempt := fs.Uint("exempt-uid", 1337, "the sidecar's uid")
	wait := fs.Duration("wait", 60*time.Second, "how long to wait for the sidecar")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return usageError{"install-ca needs --bundle OUT"}
	}
	if uint(os.Getuid()) == *exempt {
		return fmt.Errorf("refusing to run as uid %d: that uid is exempt from the egress redirect, so a sandbox running as it would bypass the filter; run the sandbox as another uid", *exempt)
	}
	roots, err := os.ReadFile(*base)
	if err != nil {
		return fmt.Errorf("the sandbox image needs %s (install ca-certificates): %w", *base, err)
	}
	pem, err := fetchCA(*from, *wait)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	bundle := append(append(roots, '\n'), pem...)
	if err := os.WriteFile(*out, bundle, 0o644); err != nil {
		return err
	}
	fmt.Printf("sidecar CA installed in %s\n", *out)
	return nil
}

// fetchCA gets the CA from the sidecar's health port, waiting for the
// sidecar to start.
func fetchCA(url string, wait time.Duration) ([]byte, error) {
	deadline := time.Now().Add(wait)
	for {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
		if err == nil {
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && rerr == nil && len(body) > 0 {
				return body, nil
			}
			err = errors.Join(rerr, fmt.Errorf("status %s", resp.Status))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no CA from %s after %v: %w", url, wait, err)
		}
		time.Sleep(500 * time.Millisecond) // the sidecar may still be starting
	}
}

// drainTimeout is how long the servers may drain on SIGTERM; the egress
// log then has logWriteOut of its own to write out the records of what
// the drain ended.
const (
	drainTimeout = 10 * time.Second
	logWriteOut  = 3 * time.Second
)
