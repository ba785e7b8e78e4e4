//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/egresslog/otlp"
	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/policy/approval"
)

// Config is agenthold's configuration file. The egress and secrets keys
// are the seed's, exactly; the rest is what a gateway needs besides.
// agenthold.example.yaml documents every key and its default.
type Config struct {
	DataDir     string `yaml:"data_dir"`
	AdminSocket string `yaml:"admin_socket"`
	MetricsAddr string `yaml:"metrics_addr"`
	// UIListen serves the web console there: a loopback address only
	// ("127.0.0.1:8088"); empty, the default, serves none.
	UIListen string        `yaml:"ui_listen"`
	Egress   EgressConfig  `yaml:"egress"`
	Secrets  SecretsConfig `yaml:"secrets"`
	Network  NetworkConfig `yaml:"network"`
	Sandbox  SandboxConfig `yaml:"sandbox"`
}

// EgressConfig is the seed's egress section, plus netguard's prefixes,
// extra upstream roots and token refresh endpoints.
type EgressConfig struct {
	Disabled      bool   `yaml:"disabled"`
	ProxyPort     uint16 `yaml:"proxy_port"`
	ExplicitPort  uint16 `yaml:"explicit_port"`
	DNSPort       uint16 `yaml:"dns_port"`
	DNSUpstream   string `yaml:"dns_upstream"`
	DNSTunnelling string `yaml:"dns_tunnelling"`
	LogKeep       int    `yaml:"log_keep"`
	LogFile       string `yaml:"log_file"`
	LogFileMaxMB  int    `yaml:"log_file_max_mb"`
	LogFileKeep   int    `yaml:"log_file_keep"`
	// LogFileMaxAge also rotates log_file once its first record is this
	// old; 0: by size only.
	LogFileMaxAge time.Duration `yaml:"log_file_max_age"`
	// LogFileAudit chains and seals log_file with the gateway's audit key
	// (<data_dir>/audit.key): agenthold audit verify checks it.
	LogFileAudit bool `yaml:"log_file_audit"`
	// OTLP sends records, spans and counters to an OpenTelemetry
	// collector (egresslog/otlp).
	OTLP           OTLPConfig `yaml:"otlp"`
	TunnelPort     uint16     `yaml:"tunnel_port"`
	RemoteListen   string     `yaml:"remote_listen"`
	RemoteTLS      bool       `yaml:"remote_tls"`
	PublicPrefixes []string   `yaml:"public_prefixes"`
	NeverPrefixes  []string   `yaml:"never_prefixes"`
	// PrivatePrefixes count as private (netguard.Config.Private): reached
	// only by agents whose policy allows private networks.
	PrivatePrefixes []string `yaml:"private_prefixes"`
	// DoHEndpoints add to the DNS-over-HTTPS resolvers every agent's
	// policy refuses unless an entry names them exactly.
	DoHEndpoints []string `yaml:"doh_endpoints"`
	// DefaultQuotas are an agent's quotas where its own policy sets none.
	DefaultQuotas QuotaConfig `yaml:"default_quotas"`
	// MaxConnections and MaxConnectionsPerAgent bound the connections the
	// gateway holds open, in all and per agent (0: 20000 and 2000).
	MaxConnections         int `yaml:"max_connections"`
	MaxConnectionsPerAgent int `yaml:"max_connections_per_agent"`
	// KernelPath "on" asks for the kernel path (tproxy/fastpath), which
	// stays off for now (fastpath.ErrSockmapDefect, said once in the
	// log); "off", the default, relays every connection in user space.
	KernelPath    string          `yaml:"kernel_path"`
	UpstreamRoots string          `yaml:"upstream_roots"`
	TokenRefresh  []RefreshConfig `yaml:"token_refresh"`
	Approvals     ApprovalsConfig `yaml:"approvals"`
}

// ApprovalsConfig tunes ask mode: how long a destination no entry allows
// is held for an answer, and the webhook asked about each.
type ApprovalsConfig struct {
	Timeout            time.Duration `yaml:"timeout"`
	MaxPendingPerAgent int           `yaml:"max_pending_per_agent"`
	SessionLength      time.Duration `yaml:"session_length"` // a session answer's end; 0: until the agent is deleted
	WebhookURL         string        `yaml:"webhook_url"`
	WebhookSecretFile  string        `yaml:"webhook_secret_file"` // the HMAC key (mode 0600), required with webhook_url
}

// OTLPConfig says which signals go to an OpenTelemetry collector, and
// where; an empty protocol, endpoint or headers leaves the choice to the
// standard OTEL_EXPORTER_OTLP_* variables.
type OTLPConfig struct {
	Logs     bool              `yaml:"logs"`     // every record as an OTLP log record
	Traces   bool              `yaml:"traces"`   // a span per HTTP request judged, in the agent's own trace
	Metrics  bool              `yaml:"metrics"`  // the counters /metrics serves
	Protocol string            `yaml:"protocol"` // grpc or http/protobuf
	Endpoint string            `yaml:"endpoint"` // the collector's base URL: http://collector:4318 (HTTP), http://collector:4317 (gRPC)
	Headers  map[string]string `yaml:"headers"`  // sent with every export
	Interval time.Duration     `yaml:"interval"` // how often metrics are exported; 0: OTEL_METRIC_EXPORT_INTERVAL, then 60 s
}

// QuotaConfig is an agent's share of the gateway (policy.Quotas): zero
// means the library's default (500 connections and 500 DNS queries a
// second, no byte limit), -1 no limit.
type QuotaConfig struct {
	ConnectionsPerSecond float64 `yaml:"connections_per_second"`
	DNSQueriesPerSecond  float64 `yaml:"dns_queries_per_second"`
	BytesPerSecondUp     float64 `yaml:"bytes_per_second_up"`
	BytesPerSecondDown   float64 `yaml:"bytes_per_second_down"`
}

// RefreshConfig names an OAuth token endpoint the gateway answers itself.
type RefreshConfig struct {
	Host          string `yaml:"host"`
	Path          string `yaml:"path"`
	RefreshSecret string `yaml:"refresh_secret"`
	AccessSecret  string `yaml:"access_secret"`
}

// SecretsConfig is the seed's secrets section.
type SecretsConfig struct {
	MasterKeyFile string `yaml:"master_key_file"`
}

// NetworkConfig is the address pool of agent networks: one IPv4 network
// of AgentPrefix4 bits (24 to 28; 24 by default) and one IPv6 /64 per
// agent, the gateway at .2 and the sandbox at .10 of it.
type NetworkConfig struct {
	Pool4        string `yaml:"pool4"`
	Pool6        string `yaml:"pool6"`
	AgentPrefix4 int    `yaml:"agent_prefix4"`
}

// SandboxConfig is how exec runs an agent's commands.
type SandboxConfig struct {
	// UIDBase is the first of the uids (and gids) agents run as: an agent
	// without its own gets the next never given before, so that no agent
	// inherits a deleted one's files or keys.
	UIDBase uint32 `yaml:"uid_base"`
	// HomeSizeMB bounds each agent's home, a tmpfs (memory the sandbox
	// may fill, never the disk the vault and the log are on).
	HomeSizeMB int `yaml:"home_size_mb"`
	// MaxProcesses bounds the processes and threads an agent's uid may
	// have at once, across all its sandboxes (RLIMIT_NPROC, which the
	// kernel counts per uid): a fork bomb stops there, not at the host's
	// kernel.pid_max, which every process on the host draws from.
	MaxProcesses int `yaml:"max_processes"`
	// MaxOpenFiles bounds the descriptors each of a sandbox's processes
	// may hold (RLIMIT_NOFILE).
	MaxOpenFiles int `yaml:"max_open_files"`
}

// Sandbox uids: the default first one, far above login users and the
// subordinate ranges of user namespaces, and the least an operator may
// give (system accounts lie below).
const (
	defaultUIDBase = 2_000_000_000
	minSandboxUID  = 1000
	// defaultHomeSizeMB is each agent's home: room for a repository and
	// its dependencies, not for a disk's worth.
	defaultHomeSizeMB = 512
	// An agent's processes and threads, and each one's descriptors: a
	// parallel build's worth, far below a host's pid_max (32,768 on many).
	defaultMaxProcesses = 1024
	defaultMaxOpenFiles = 4096
)

// masterKeyEnv is the environment variable that may hold the master key.
const masterKeyEnv = "AGENTHOLD_MASTER_KEY"

func defaultConfig() Config {
	return Config{
		DataDir: "/var/lib/agenthold",
		Egress: EgressConfig{
			ProxyPort: 15001, ExplicitPort: 15002, DNSPort: 15053, DNSTunnelling: "record", LogKeep: 5000, KernelPath: "off",
			LogFileMaxMB: egresslog.DefaultMaxFileBytes >> 20, LogFileKeep: egresslog.DefaultKeepFiles,
			Approvals: ApprovalsConfig{Timeout: approval.DefaultTimeout, MaxPendingPerAgent: approval.DefaultMaxPendingPerAgent},
		},
		Network: NetworkConfig{Pool4: "10.88.0.0/16", Pool6: "fd00:88::/48", AgentPrefix4: 24},
		Sandbox: SandboxConfig{UIDBase: defaultUIDBase, HomeSizeMB: defaultHomeSizeMB, MaxProcesses: defaultMaxProcesses, MaxOpenFiles: defaultMaxOpenFiles},
	}
}

// loadConfig reads a YAML configuration over the defaults. An unknown key
// or a bad value is an error that names the key.
func loadConfig(path string) (Config, error) {
	cfg := defaultConfig()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("config: %w", err)
		}
		var root yaml.Node
		if err := yaml.Unmarshal(data, &root); err != nil {
			return cfg, fmt.Errorf("config %s: %w", path, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return cfg, fmt.Errorf("config %s: %s", path, nameKeys(err, &root))
		}
	}
	return cfg, cfg.validate()
}

var yamlLine = regexp.MustCompile(`line (\d+): `)

// nameKeys rewrites the YAML decoder's "line N: ..." messages to name the
// key at that line ("egress.proxy_port: ...").
func nameKeys(err error, root *yaml.Node) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, m := range te.Errors {
		if sub := yamlLine.FindStringSubmatch(m); sub != nil {
			line, _ := strconv.Atoi(sub[1])
			if key := keyAtLine(root, line, ""); key != "" {
				m = key + ": " + strings.TrimPrefix(m, sub[0])
			}
		}
		msgs = append(msgs, m)
	}
	return strings.Join(msgs, "; ")
}

// keyAtLine finds the dotted path of the mapping key on a line.
func keyAtLine(n *yaml.Node, line int, prefix string) string {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			p := prefix
			if n.Kind == yaml.SequenceNode {
				p = fmt.Sprintf("%s[%d]", prefix, i)
			}
			if k := keyAtLine(c, line, p); k != "" {
				return k
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			path := key.Value
			if prefix != "" {
				path = prefix + "." + key.Value
			}
			if key.Line == line {
				return path
			}
			if k := keyAtLine(val, line, path); k != "" {
				return k
			}
		}
	}
	return ""
}

// gatewayPolicy is what the configuration adds to every agent's policy.
func (c *Config) gatewayPolicy() gatewayPolicy {
	return gatewayPolicy{quotas: QuotaSpec(c.Egress.DefaultQuotas), doh: c.Egress.DoHEndpoints}
}

func (c *Config) validate() error {
	if c.DataDir == "" || !filepath.IsAbs(c.DataDir) {
		return fmt.Errorf("config: data_dir must be an absolute path, not %q", c.DataDir)
	}
	ports := map[string]uint16{"egress.proxy_port": c.Egress.ProxyPort, "egress.explicit_port": c.Egress.ExplicitPort, "egress.dns_port": c.Egress.DNSPort, "egress.tunnel_port": c.Egress.TunnelPort}
	seen := map[uint16]string{}
	for key, p := range ports {
		if p == 0 && key == "egress.tunnel_port" {
			continue // none
		}
		if p == 0 {
			return fmt.Errorf("config: %s must be a port in 1-65535", key)
		}
		if other, ok := seen[p]; ok {
			return fmt.Errorf("config: %s and %s are both %d", key, other, p)
		}
		seen[p] = key
	}
	if c.Egress.RemoteListen != "" {
		ap, err := netip.ParseAddrPort(c.Egress.RemoteListen)
		if err != nil || ap.Port() == 0 {
			return fmt.Errorf("config: egress.remote_listen: %q is not an address:port", c.Egress.RemoteListen)
		}
		if other, ok := seen[ap.Port()]; ok {
			return fmt.Errorf("config: egress.remote_listen and %s are both %d", other, ap.Port())
		}
	}
	if t := c.Egress.DNSTunnelling; t != "record" && t != "refuse" {
		return fmt.Errorf("config: egress.dns_tunnelling must be record or refuse, not %q", t)
	}
	if c.Egress.LogFileMaxMB <= 0 || c.Egress.LogFileKeep <= 0 || c.Egress.LogFileMaxAge < 0 {
		return fmt.Errorf("config: egress.log_file_max_mb and egress.log_file_keep must be positive, not %d and %d, and egress.log_file_max_age not negative", c.Egress.LogFileMaxMB, c.Egress.LogFileKeep)
	}
	if c.Egress.LogKeep <= 0 {
		return fmt.Errorf("config: egress.log_keep must be positive, not %d", c.Egress.LogKeep)
	}
	if c.UIListen != "" {
		host, _, err := net.SplitHostPort(c.UIListen)
		if ip, perr := netip.ParseAddr(host); err != nil || perr != nil || !ip.IsLoopback() {
			return fmt.Errorf("config: ui_listen must be a loopback address and port (127.0.0.1:8088), not %q: the console is never served on a network", c.UIListen)
		}
	}
	if o := c.Egress.OTLP; o.Interval < 0 || (o.Protocol != "" && o.Protocol != otlp.ProtocolGRPC && o.Protocol != otlp.ProtocolHTTP) {
		return fmt.Errorf("config: egress.otlp: protocol must be %s or %s, not %q, and interval must not be negative", otlp.ProtocolGRPC, otlp.ProtocolHTTP, o.Protocol)
	}
	if a := c.Egress.Approvals; a.Timeout < 0 || a.MaxPendingPerAgent < 0 || a.SessionLength < 0 || (a.WebhookURL != "") != (a.WebhookSecretFile != "") {
		return fmt.Errorf("config: egress.approvals: timeout, max_pending_per_agent and session_length must not be negative, and webhook_url and webhook_secret_file go together")
	}
	if c.Egress.MaxConnections < 0 || c.Egress.MaxConnectionsPerAgent < 0 {
		return fmt.Errorf("config: egress.max_connections and egress.max_connections_per_agent must not be negative")
	}
	if k := c.Egress.KernelPath; k != "on" && k != "off" {
		return fmt.Errorf("config: egress.kernel_path must be on or off, not %q", k)
	}
	if _, err := (PolicySpec{}).compile(c.gatewayPolicy()); err != nil {
		return fmt.Errorf("config: egress.default_quotas or egress.doh_endpoints: %w", err)
	}
	for key, list := range map[string][]string{"egress.public_prefixes": c.Egress.PublicPrefixes, "egress.never_prefixes": c.Egress.NeverPrefixes, "egress.private_prefixes": c.Egress.PrivatePrefixes} {
		for _, p := range list {
			if _, err := netip.ParsePrefix(p); err != nil {
				return fmt.Errorf("config: %s: %q is not a prefix", key, p)
			}
		}
	}
	if c.Egress.DNSUpstream != "" {
		if _, err := netip.ParseAddrPort(c.Egress.DNSUpstream); err != nil {
			if _, err := netip.ParseAddr(c.Egress.DNSUpstream); err != nil {
				return fmt.Errorf("config: egress.dns_upstream: %q is not an address or address:port", c.Egress.DNSUpstream)
			}
		}
	}
	if b := c.Network.AgentPrefix4; b < 24 || b > 28 {
		return fmt.Errorf("config: network.agent_prefix4 must be 24 to 28 (the sandbox is .10 of its network), not %d", b)
	}
	p4, err := netip.ParsePrefix(c.Network.Pool4)
	if err != nil || !p4.Addr().Is4() || p4.Bits() >= c.Network.AgentPrefix4 {
		return fmt.Errorf("config: network.pool4: %q is not an IPv4 prefix wider than network.agent_prefix4 (/%d)", c.Network.Pool4, c.Network.AgentPrefix4)
	}
	p6, err := netip.ParsePrefix(c.Network.Pool6)
	if err != nil || !p6.Addr().Is6() || p6.Bits() > 56 {
		return fmt.Errorf("config: network.pool6: %q is not an IPv6 prefix of /56 or wider", c.Network.Pool6)
	}
	if c.Egress.LogFile != "" && !filepath.IsAbs(c.Egress.LogFile) {
		return fmt.Errorf("config: egress.log_file must be an absolute path, not %q", c.Egress.LogFile)
	}
	if c.Sandbox.UIDBase < minSandboxUID || uint64(c.Sandbox.UIDBase) >= 1<<31 {
		return fmt.Errorf("config: sandbox.uid_base must be in %d-%d, not %d", minSandboxUID, 1<<31-1, c.Sandbox.UIDBase)
	}
	if c.Sandbox.HomeSizeMB < 1 {
		return fmt.Errorf("config: sandbox.home_size_mb must be positive, not %d", c.Sandbox.HomeSizeMB)
	}
	if c.Sandbox.MaxProcesses < 1 {
		return fmt.Errorf("config: sandbox.max_processes must be positive, not %d", c.Sandbox.MaxProcesses)
	}
	if c.Sandbox.MaxOpenFiles < 16 {
		return fmt.Errorf("config: sandbox.max_open_files must be at least 16, not %d", c.Sandbox.MaxOpenFiles)
	}
	for i, r := range c.Egress.TokenRefresh {
		if r.Host == "" || !strings.HasPrefix(r.Path, "/") || r.RefreshSecret == "" {
			return fmt.Errorf("config: egress.token_refresh[%d] needs host, path (starting with /) and refresh_secret", i)
		}
	}
	return nil
}

func (c *Config) adminSocket() string {
	if c.AdminSocket != "" {
		return c.AdminSocket
	}
	return filepath.Join(c.DataDir, "admin.sock")
}

func (c *Config) masterKeyFile() string {
	if c.Secrets.MasterKeyFile != "" {
		return c.Secrets.MasterKeyFile
	}
	return filepath.Join(c.DataDir, "master.key")
}

// dnsUpstreams is the DNS upstream as a list, and where it came from:
// egress.dns_upstream, else the resolv.conf of the named network namespace
// the server runs in (as `ip netns exec` would use), else the host's.
func (c *Config) dnsUpstreams() ([]string, string, error) {
	u := c.Egress.DNSUpstream
	if u != "" {
		if _, err := netip.ParseAddrPort(u); err != nil {
			u = netip.AddrPortFrom(netip.MustParseAddr(u), 53).String()
		}
		return []string{u}, "egress.dns_upstream", nil
	}
	path := "/etc/resolv.conf"
	if name := netns.Current(); name != "" {
		if p := filepath.Join("/etc/netns", name, "resolv.conf"); fileExists(p) {
			path = p
		}
	}
	servers, err := dnsfilter.UpstreamsFromFile(path)
	if err != nil {
		return nil, path, fmt.Errorf("no DNS upstream (set egress.dns_upstream): %w", err)
	}
	return servers, path, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// openPorts are the server's ports sandboxes may reach: the explicit
// proxy's, and the tunnel's if there is one.
func (c *Config) openPorts() []uint16 {
	if c.Egress.TunnelPort != 0 {
		return []uint16{c.Egress.ExplicitPort, c.Egress.TunnelPort}
	}
	return []uint16{c.Egress.ExplicitPort}
}
