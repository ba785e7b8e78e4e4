//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/tproxy/nftrules"
	"github.com/agenthold/egress/vault"
	"github.com/agenthold/egress/vault/awssig"
)

// server is agenthold's egress gateway: every building block, composed.
type server struct {
	cfg    Config
	log    *slog.Logger
	pool4  netip.Prefix
	pool6  netip.Prefix
	agents *agents
	vault  *vault.Vault
	// keyFromEnv: the master key came from AGENTHOLD_MASTER_KEY, not a
	// file agenthold can rotate.
	keyFromEnv bool
	ca         *mitm.CA
	guard      *netguard.Guard
	elog       *egresslog.Log
	dns        *dnsfilter.Server
	proxy      *tproxy.Proxy
	ic         *mitm.Interceptor
	rules      *nftrules.Rules
	// approvals holds what agents in ask mode reach for, for an answer.
	approvals *approval.Broker
	console   *console // the web console, if ui_listen is set
	// servers runs every server; its context ends on SIGTERM or when one
	// fails, and serve then stops the gateway, last started first.
	servers *lifecycle.Group

	mu sync.Mutex // serialises agent changes
}

// caPath is the interception CA's certificate, kept with its key.
func (s *server) caPath() string { return filepath.Join(s.cfg.DataDir, "egress", "ca.crt") }

// trustDir holds what a sandbox needs to trust the interception CA, and
// nothing else, readable by every uid: a sandbox a container runtime
// starts in an agent's namespace mounts it from here. The data directory
// is searchable for it (0711) but not listable; everything else in it
// stays the gateway's alone (0700 directories, 0600 files).
func (s *server) trustDir() string { return filepath.Join(s.cfg.DataDir, "trust") }

// Paths of the trust files: the CA, the bundle (the system's roots, the
// extra upstream roots and the CA) and NODE_EXTRA_CA_CERTS's file (the CA
// and the extra upstream roots, mitm.CA.NodeExtra).
func (s *server) publicCAPath() string  { return filepath.Join(s.trustDir(), "ca.crt") }
func (s *server) bundlePath() string    { return filepath.Join(s.trustDir(), "bundle.pem") }
func (s *server) nodeExtraPath() string { return filepath.Join(s.trustDir(), "node-extra.pem") }

// startServer brings the gateway up: state, vault, CA, DNS, proxies,
// rules, agents, admin API. On any error what was started is stopped.
func startServer(ctx context.Context, cfg Config, logger *slog.Logger) (s *server, err error) {
	s = &server{cfg: cfg, log: logger, servers: lifecycle.New(ctx)}
	s.pool4 = netip.MustParsePrefix(cfg.Network.Pool4)
	s.pool6 = netip.MustParsePrefix(cfg.Network.Pool6)
	defer func() {
		if err != nil {
			s.servers.Stop(context.Background())
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return s, err
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return s, err
	}
	s.servers.OnStop("data directory lock", lifecycle.Closing(lock))
	if err := s.openVault(); err != nil {
		return s, err
	}
	if err := s.openCA(); err != nil {
		return s, err
	}
	if err := s.openGuard(); err != nil {
		return s, err
	}
	s.elog = &egresslog.Log{Keep: cfg.Egress.LogKeep, KeepDenied: cfg.Egress.LogKeep, CountedReasons: countedReasons()}
	if cfg.Egress.LogFile != "" {
		file := egresslog.JSONFile{Path: cfg.Egress.LogFile, MaxBytes: int64(cfg.Egress.LogFileMaxMB) << 20, Keep: cfg.Egress.LogFileKeep, MaxAge: cfg.Egress.LogFileMaxAge}
		if cfg.Egress.LogFileAudit {
			if file.Seal, err = loadAuditKey(s.auditKeyPath()); err != nil {
				return s, fmt.Errorf("egress.log_file_audit: %w", err)
			}
		}
		sink, err := file.Open()
		if err != nil {
			return s, fmt.Errorf("egress.log_file: %w", err)
		}
		s.elog.Sinks = append(s.elog.Sinks, sink)
	}
	if err := s.addOTLPSinks(ctx); err != nil {
		return s, err
	}
	s.servers.OnStop("egress log", lifecycle.WithOwnTime(logWriteOut, s.elog.Shutdown)) // closes the file too
	s.agents = newAgents(cfg.DataDir)
	// The rules and the agents' links go after the data plane has
	// drained (they are registered before it starts): until its links
	// are gone, a sandbox's packets still meet the rules.
	s.servers.OnStop("nftables rules", func(context.Context) error {
		if s.rules == nil {
			return nil
		}
		return s.rules.Close()
	})
	s.servers.OnStop("agents", func(context.Context) error { return s.releaseAgents() })
	s.warnPrivateMounts()
	s.warnSubordinateIDs()

	if err := s.startDataPlane(); err != nil {
		return s, err
	}
	specs, err := s.agents.load()
	if err != nil {
		return s, fmt.Errorf("agents: %w", err)
	}
	// After a crash: what no record names goes; what records name is
	// adopted or made again below.
	sweep(cfg.DataDir, specs, logger.Info)
	for _, spec := range specs {
		if _, err := s.addAgent(ctx, spec); err != nil {
			return s, fmt.Errorf("agent %s: %w", spec.Name, err)
		}
	}
	if err := s.startAdmin(); err != nil {
		return s, err
	}
	if err := s.startConsole(); err != nil {
		return s, err
	}
	if err := s.startOTLPMetrics(ctx); err != nil {
		return s, err
	}
	return s, nil
}

// lockDataDir takes an exclusive lock on the data directory, so that a
// second server on it refuses to start.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "agenthold.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another agenthold is running on %s", dir)
	}
	return f, nil
}

func (s *server) openVault() error {
	store := vault.FileStorage{Path: filepath.Join(s.cfg.DataDir, "secrets.json")}
	key, err := vault.KeyFromEnv(masterKeyEnv)
	// Read once; no child and no later reader of the environment sees it.
	os.Unsetenv(masterKeyEnv)
	s.keyFromEnv = err == nil
	if errors.Is(err, os.ErrNotExist) {
		// A rotation a crash cut short is finished (or dropped) first.
		if err = vault.RecoverKeyFile(store, s.cfg.masterKeyFile()); err == nil {
			key, err = vault.LoadKeyFile(s.cfg.masterKeyFile())
		}
	}
	if err != nil {
		return err
	}
	s.vault, err = vault.Open(store, key, vault.Config{PlaceholderPrefix: "agenthold", SigV4: awssig.Signer{}})
	return err
}

func (s *server) openCA() error {
	ca, err := mitm.LoadOrCreateCA(s.caPath(), filepath.Join(s.cfg.DataDir, "egress", "ca.key"), "agenthold egress CA")
	if err != nil {
		return err
	}
	s.ca = ca
	bundle, err := ca.Bundle()
	if err != nil {
		return err
	}
	var extra []byte
	if s.cfg.Egress.UpstreamRoots != "" {
		if extra, err = os.ReadFile(s.cfg.Egress.UpstreamRoots); err != nil {
			return fmt.Errorf("egress.upstream_roots: %w", err)
		}
		bundle = append(append(slices.Clone(extra), '\n'), bundle...)
	}
	if err := os.Chmod(s.cfg.DataDir, 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(s.trustDir(), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.Chmod(s.trustDir(), 0o755); err != nil {
		return err
	}
	for path, data := range map[string][]byte{s.publicCAPath(): ca.PEM(), s.nodeExtraPath(): ca.NodeExtra(extra), s.bundlePath(): bundle} {
		if err := writeFileAtomic(path, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (s *server) openGuard() error {
	// Sandboxes never reach one another through the gateway, whatever
	// the pools are and whatever an operator declares public.
	cfg := netguard.Config{Never: []netip.Prefix{s.pool4, s.pool6}}
	for _, p := range s.cfg.Egress.PublicPrefixes {
		cfg.Public = append(cfg.Public, netip.MustParsePrefix(p))
	}
	for _, p := range s.cfg.Egress.NeverPrefixes {
		cfg.Never = append(cfg.Never, netip.MustParsePrefix(p))
	}
	for _, p := range s.cfg.Egress.PrivatePrefixes {
		cfg.Private = append(cfg.Private, netip.MustParsePrefix(p))
	}
	g, err := netguard.New(cfg)
	if err != nil {
		return err
	}
	s.guard = g
	// The gateway's own addresses are never dialled, those it gains
	// while it runs too.
	follow, stop := context.WithCancel(context.Background())
	s.servers.OnStop("own addresses", func(context.Context) error { stop(); return nil })
	return g.FollowLocal(follow)
}

// startDataPlane starts DNS, the proxies and the nftables rules.
func (s *server) startDataPlane() error {
	var roots *x509.CertPool
	if s.cfg.Egress.UpstreamRoots != "" {
		var err error
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		pem, err := os.ReadFile(s.cfg.Egress.UpstreamRoots)
		if err != nil || !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("egress.upstream_roots: no certificate in %s", s.cfg.Egress.UpstreamRoots)
		}
	}
	upstreams, from, err := s.cfg.dnsUpstreams()
	if err != nil {
		return err
	}
	s.log.Info("dns upstream", "servers", strings.Join(upstreams, " "), "from", from)
	if err := s.openApprovals(); err != nil {
		return err
	}
	s.dns = &dnsfilter.Server{
		Agents: s.agents.lookup, Upstreams: upstreams, Guard: s.guard, Log: s.elog, Logger: s.log, Approver: s.approvals,
		Tunnel: dnsfilter.TunnelDetection{Refuse: s.cfg.Egress.DNSTunnelling == "refuse"},
	}
	s.servers.OnStop("dns", s.dns.Shutdown)
	s.ic = &mitm.Interceptor{
		Leaves: &mitm.Leaves{CA: s.ca}, Claim: s.vault.Covers, Injector: s.vault,
		Guard: s.guard, Resolver: s.dns, RootCAs: roots, Log: s.elog, Logger: s.log,
	}
	s.servers.OnStop("upstream pools", func(context.Context) error { s.ic.CloseIdleConnections(); return nil })
	// GitHub App tokens are minted the way intercepted requests go out.
	s.vault.SetTokenClient(s.ic.Client(false))
	for _, r := range s.cfg.Egress.TokenRefresh {
		x := &mitm.RefreshExchange{Host: r.Host, Path: r.Path, RefreshSecret: r.RefreshSecret, AccessSecret: r.AccessSecret, Store: s.vault, Client: s.ic.Client(false)}
		s.ic.Hooks = append(s.ic.Hooks, x.Hook())
	}
	s.proxy = &tproxy.Proxy{
		Agents: s.agents.lookup, Identify: s.identify, Names: s.dns.Names, Guard: s.guard, Resolver: s.dns,
		Interceptor: s.ic, Log: s.elog, Logger: s.log, Approver: s.approvals,
		MaxConns: s.cfg.Egress.MaxConnections, MaxConnsPerAgent: s.cfg.Egress.MaxConnectionsPerAgent,
	}
	if kp := s.kernelPath(); kp != nil {
		s.proxy.KernelPath = kp
		// Registered before the proxy, so closed after it has drained.
		s.servers.OnStop("kernel path", func(context.Context) error { return kp.Close() })
	}
	s.servers.OnStop("proxy", s.proxy.Shutdown)
	// Registered after the servers, so stopped before them: what waits
	// for an answer is refused, and nothing holds up their drain.
	s.servers.OnStop("approvals", lifecycle.Closing(s.approvals))
	port := func(p uint16) string { return net.JoinHostPort("::", strconv.Itoa(int(p))) }
	dnsLn, err := net.Listen("tcp", port(s.cfg.Egress.DNSPort))
	if err != nil {
		return err
	}
	dnsPC, err := net.ListenPacket("udp", port(s.cfg.Egress.DNSPort))
	if err != nil {
		dnsLn.Close()
		return err
	}
	s.servers.Go("dns", func() error { return s.dns.Serve(dnsPC, dnsLn) }, dnsfilter.ErrServerClosed)
	transparent, err := tproxy.Listen("tcp", port(s.cfg.Egress.ProxyPort))
	if err != nil {
		return err
	}
	s.servers.Go("transparent proxy", func() error { return s.proxy.Serve(transparent) }, tproxy.ErrServerClosed)
	explicit, err := tproxy.Listen("tcp", port(s.cfg.Egress.ExplicitPort))
	if err != nil {
		return err
	}
	s.servers.Go("explicit proxy", func() error { return s.proxy.ServeExplicit(explicit) }, tproxy.ErrServerClosed)
	if s.cfg.Egress.RemoteListen != "" && !s.cfg.Egress.Disabled {
		remote, err := tproxy.Listen("tcp", s.cfg.Egress.RemoteListen)
		if err != nil {
			return fmt.Errorf("egress.remote_listen: %w", err)
		}
		if s.cfg.Egress.RemoteTLS {
			host := netip.MustParseAddrPort(s.cfg.Egress.RemoteListen).Addr().String()
			remote = tls.NewListener(remote, &tls.Config{
				MinVersion:     tls.VersionTLS12,
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.ic.Leaves.Get(host) },
			})
		}
		s.servers.Go("explicit proxy for remote agents", func() error { return s.proxy.ServeExplicit(remote) }, tproxy.ErrServerClosed)
	}
	s.rules, err = nftrules.GatewayRules{
		Table: tableName(s.cfg.DataDir), DNSPort: s.cfg.Egress.DNSPort, ProxyPort: s.cfg.Egress.ProxyPort,
		OpenPorts: s.cfg.openPorts(), NoNetwork: s.cfg.Egress.Disabled,
		AgentPools: []netip.Prefix{s.pool4, s.pool6},
	}.Apply()
	if err != nil {
		return fmt.Errorf("nftables (agenthold needs CAP_NET_ADMIN): %w", err)
	}
	return nil
}

// addAgent wires an agent's network, makes its home, and registers it; a
// remote agent is only registered.
func (s *server) addAgent(ctx context.Context, spec AgentSpec) (*agent, error) {
	if !validAgentName.MatchString(spec.Name) {
		return nil, fmt.Errorf("invalid agent name %q (lower-case letters, digits and -, at most 32)", spec.Name)
	}
	pol, err := spec.Policy.compile(s.cfg.gatewayPolicy())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if spec.Remote {
		if spec.NetNS != "" || spec.UID != 0 || spec.GID != 0 || spec.TokenHash == "" {
			return nil, fmt.Errorf("agent %s: a remote agent has a token, and no namespace or uid", spec.Name)
		}
		spec.Index = -1
		a := &agent{spec: spec}
		a.policy.Store(pol)
		if err := s.agents.add(a); err != nil {
			return nil, err
		}
		s.log.Info("agent up", "agent", spec.Name, "remote", true)
		return a, nil
	}
	// Keep a persisted index, so that a sandbox's addresses survive a
	// restart; otherwise take the lowest free one.
	if spec, err = s.agents.allocate(spec, poolSize(s.pool4, s.pool6, s.cfg.Network.AgentPrefix4)); err != nil {
		return nil, err
	}
	if spec, err = s.sandboxIDs(spec); err != nil {
		return nil, err
	}
	a := &agent{spec: spec, uid: spec.UID, gid: spec.GID, bits4: s.cfg.Network.AgentPrefix4}
	a.policy.Store(pol)
	a.gw4, a.sb4, a.gw6, a.sb6 = networkAddrs(s.pool4, s.pool6, a.bits4, spec.Index)
	if err := s.makeHome(a); err != nil {
		return nil, err
	}
	if err := wire(ctx, s.cfg.DataDir, a); err != nil {
		return nil, err
	}
	// The link admits the sandbox's own addresses as source, nothing else.
	if err := s.rules.AddLink(nftrules.Link{Interface: a.gwIface, Addrs: []netip.Addr{a.sb4, a.sb6}}); err != nil {
		unwire(a)
		return nil, err
	}
	// The agent's gateway addresses are in the pools, which the guard
	// never dials (openGuard): its own addresses are not built again
	// for them.
	err = s.agents.add(a)
	s.log.Info("agent up", "agent", spec.Name, "netns", a.ns.Name, "sandbox", a.sb4, "gateway", a.gw4, "uid", a.uid, "gid", a.gid)
	return a, err
}

// sandboxIDs gives an agent the uid and gid its commands run as: its own
// (at least 1000, not the server's, not another agent's), or else the next
// from sandbox.uid_base on that no agent ever had, so that no agent
// inherits a deleted one's files or kernel keys. The next is kept in
// <data_dir>/uid.next.
func (s *server) sandboxIDs(spec AgentSpec) (AgentSpec, error) {
	used := s.agents.idsInUse()
	if spec.UID != 0 || spec.GID != 0 {
		for _, id := range []struct {
			kind   string
			n      uint32
			server int
		}{{"uid", spec.UID, os.Getuid()}, {"gid", spec.GID, os.Getgid()}} {
			switch {
			case id.n < minSandboxUID:
				return spec, fmt.Errorf("agent %s: %s %d: give both --uid and --gid, each at least %d (system accounts lie below)", spec.Name, id.kind, id.n, minSandboxUID)
			case id.n == uint32(id.server):
				return spec, fmt.Errorf("agent %s: %s %d is the server's", spec.Name, id.kind, id.n)
			case used[id.n]:
				return spec, fmt.Errorf("agent %s: %s %d is another agent's", spec.Name, id.kind, id.n)
			}
		}
		return spec, nil
	}
	path := filepath.Join(s.cfg.DataDir, "uid.next")
	next := s.cfg.Sandbox.UIDBase
	if b, err := os.ReadFile(path); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil && uint32(n) > next {
			next = uint32(n)
		}
	}
	for used[next] || next == uint32(os.Getuid()) || next == uint32(os.Getgid()) {
		next++
	}
	if next >= 1<<31 {
		return spec, errors.New("no sandbox uid left below 2^31")
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(uint64(next)+1, 10)+"\n"), 0o600); err != nil {
		return spec, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return spec, err
	}
	spec.UID, spec.GID = next, next
	return spec, nil
}

// homeDir is an agent's home on the host, which exec shows the sandbox as
// /home/AGENT; it survives restarts and goes with the agent.
func (s *server) homeDir(name string) string { return filepath.Join(s.cfg.DataDir, "homes", name) }

// makeHome gives an agent its home: a tmpfs of sandbox.home_size_mb, so
// that no sandbox can fill the disk that holds the vault and the log. It
// lives while the server runs (a crashed server's is adopted as it is).
func (s *server) makeHome(a *agent) error {
	if err := os.MkdirAll(filepath.Join(s.cfg.DataDir, "homes"), 0o700); err != nil {
		return err
	}
	home := s.homeDir(a.spec.Name)
	if err := os.Mkdir(home, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if !isMountPoint(home) {
		opts := fmt.Sprintf("size=%dm,mode=0700,uid=%d,gid=%d", s.cfg.Sandbox.HomeSizeMB, a.uid, a.gid)
		if err := unix.Mount("tmpfs", home, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount the agent's home: %w", err)
		}
	}
	return os.Lchown(home, int(a.uid), int(a.gid))
}

// dropHome unmounts an agent's home and removes what is left of it.
func dropHome(home string) error {
	if err := unmountHome(home); err != nil {
		return err
	}
	return os.RemoveAll(home)
}

// unmountHome unmounts an agent's home, keeping the directory.
func unmountHome(home string) error {
	if !isMountPoint(home) {
		return nil
	}
	if err := unix.Unmount(home, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", home, err)
	}
	return nil
}

// isMountPoint reports whether dir is the root of a mount: on another
// device than its parent.
func isMountPoint(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// removeAgent tears an agent's network down and forgets it, its home and
// its attachments.
func (s *server) removeAgent(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.agents.remove(name)
	if a == nil {
		return err
	}
	s.proxy.Forget(name) // nothing it opened outlives it
	s.ic.Forget(name)
	s.approvals.Forget(name)
	if a.spec.Remote {
		s.dns.Forget(name)
		for _, at := range s.vault.Attachments(name) {
			s.vault.Detach(name, at.Secret)
		}
		s.log.Info("agent deleted", "agent", name, "remote", true, "err", err)
		return err
	}
	if s.rules != nil {
		s.rules.RemoveLink(a.gwIface)
	}
	killSandboxes(a.nsPath, a.created)
	unwire(a)
	s.dns.Forget(name)
	for _, at := range s.vault.Attachments(name) {
		s.vault.Detach(name, at.Secret)
	}
	if rmErr := dropHome(s.homeDir(name)); rmErr != nil && err == nil {
		err = rmErr
	}
	s.log.Info("agent deleted", "agent", name, "err", err)
	return err
}

// identify names the agent behind an explicit-proxy request: a remote
// agent by its token (required on egress.remote_listen), a local one by
// its sandbox's address.
func (s *server) identify(c tproxy.Credentials) (string, *policy.Policy, error) {
	if c.Local.Port() == s.cfg.Egress.ExplicitPort {
		// The sandboxes' own port: by address only, whatever the request
		// carries, so that no sandbox speaks as a remote agent.
		if name, pol, ok := s.agents.lookup(c.Src); ok {
			return name, pol, nil
		}
		return "", nil, errors.New(tproxy.ReasonUnknownSource)
	}
	if c.Token == "" {
		return "", nil, errors.New("a token is required: Proxy-Authorization: Basic AGENT:TOKEN")
	}
	return s.agents.byToken(c.User, c.Token)
}

// setPolicy replaces an agent's policy: every DNS query, connection and
// request from now on is judged by it, and the spliced connections it
// refuses are ended.
func (s *server) setPolicy(name string, spec PolicySpec) error {
	pol, err := spec.compile(s.cfg.gatewayPolicy())
	if err != nil {
		return err
	}
	if err := s.agents.setPolicy(name, spec, pol); err != nil {
		return err
	}
	s.proxy.Rejudge(name)
	s.approvals.Revoke(name) // what was answered under the old policy is asked again
	s.log.Info("agent policy set", "agent", name, "mode", spec.Mode, "entries", len(spec.Allow))
	return nil
}

// warnPrivateMounts says so when the server runs in a mount namespace of
// its own (as under `ip netns exec`): the namespaces it mounts are then
// visible only there, and disappear with it; exec reaches them through
// /proc/PID/root.
func (s *server) warnPrivateMounts() {
	if !privateMountNS() {
		return
	}
	s.log.Warn("agenthold runs in a mount namespace of its own (started with `ip netns exec`?): " +
		"the sandbox namespaces it makes are mounted only there, and go with it; " +
		"exec reaches them through /proc/PID/root as root. Prefer `nsenter --net=/run/netns/NAME agenthold serve`.")
}

// warnSubordinateIDs says so when the sandbox uids may meet the ranges
// /etc/subuid and /etc/subgid hand to users' user namespaces: a process
// of such a user could then act as a sandbox's uid.
func (s *server) warnSubordinateIDs() {
	lo, hi := uint64(s.cfg.Sandbox.UIDBase), uint64(s.cfg.Sandbox.UIDBase)+1<<20
	for _, path := range []string{"/etc/subuid", "/etc/subgid"} {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Split(strings.TrimSpace(line), ":")
			if len(f) != 3 {
				continue
			}
			start, err1 := strconv.ParseUint(f[1], 10, 32)
			count, err2 := strconv.ParseUint(f[2], 10, 32)
			if err1 == nil && err2 == nil && start < hi && lo < start+count {
				s.log.Warn("sandbox uids meet a subordinate id range: choose another sandbox.uid_base", "file", path, "owner", f[0], "start", start, "count", count, "uid_base", lo)
			}
		}
	}
}

// privateMountNS reports whether some ancestor of this process (as far as
// it may look) is in another mount namespace.
func privateMountNS() bool {
	self, err := os.Stat("/proc/self/ns/mnt")
	if err != nil {
		return false
	}
	for pid := os.Getppid(); pid > 1; {
		st, err := os.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil {
			return false
		}
		if !os.SameFile(self, st) {
			return true
		}
		if pid, err = parentOf(pid); err != nil {
			return false
		}
	}
	return false
}

// parentOf reads a process's parent from /proc/PID/stat.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, errors.New("malformed stat")
	}
	return strconv.Atoi(f[1])
}

// releaseAgents unwires every agent and unmounts the homes of local
// ones, on the way down: the records stay, so the next start wires them
// again.
func (s *server) releaseAgents() error {
	var errs []error
	for _, a := range s.agents.list() {
		unwire(a)
		if !a.spec.Remote {
			if err := unmountHome(s.homeDir(a.spec.Name)); err != nil {
				errs = append(errs, fmt.Errorf("agent %s home: %w", a.spec.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// sandboxEnv is the environment a sandbox runs with: its placeholders,
// the explicit proxy as a hint, and the CA variables.
func (s *server) sandboxEnv(a *agent) []string {
	proxy := "http://" + net.JoinHostPort(a.gw4.String(), strconv.Itoa(int(s.cfg.Egress.ExplicitPort)))
	env := []string{"HTTPS_PROXY=" + proxy, "HTTP_PROXY=" + proxy, "https_proxy=" + proxy, "http_proxy=" + proxy, "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1"}
	env = append(env, mitm.Env(s.bundlePath(), s.nodeExtraPath())...)
	return append(env, s.vault.Environment(a.spec.Name)...)
}

// execInfo is what exec needs to confine a command to a's sandbox.
func (s *server) execInfo(a *agent) ExecInfo {
	hide := []string{s.cfg.adminSocket(), s.cfg.masterKeyFile()}
	for _, f := range []string{s.cfg.Egress.LogFile, s.cfg.Egress.Approvals.WebhookSecretFile} {
		if f != "" {
			hide = append(hide, f)
		}
	}
	return ExecInfo{
		Agent: a.spec.Name, NetNSPath: a.nsPath, ServerPID: os.Getpid(),
		UID: a.uid, GID: a.gid, Home: s.homeDir(a.spec.Name), Env: s.sandboxEnv(a),
		DataDir: s.cfg.DataDir, TrustFiles: []string{s.publicCAPath(), s.bundlePath(), s.nodeExtraPath()}, Hide: hide,
		ResolvConf:   a.resolvConf(),
		MaxProcesses: s.cfg.Sandbox.MaxProcesses, MaxOpenFiles: s.cfg.Sandbox.MaxOpenFiles,
	}
}

// drainTimeout is how long the servers may drain on SIGTERM; the egress
// log then has logWriteOut of its own to write out the records of what
// the drain ended (13 s in all, within the DaemonSet's 15 s grace).
const (
	drainTimeout = 10 * time.Second
	logWriteOut  = 3 * time.Second
)

// writeFileAtomic replaces path with data, so that a reader sees the old
// file or the new one, never a part.
// The temporary file is new and randomly named (never a link another
// user placed), and synced before it replaces path.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	err = errors.Join(err, f.Chmod(mode), f.Sync(), f.Close()) // the mode whatever the umask
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
