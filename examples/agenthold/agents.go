//go:build linux

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/agenthold/egress/examples/netns"
	"github.com/agenthold/egress/policy"
)

// PolicySpec is an agent's network policy as admins set it.
type PolicySpec struct {
	Mode                 string   `json:"mode"` // open (default), allowlist, or ask (an allowlist that asks about the rest)
	Allow                []string `json:"allow,omitempty"`
	AllowPrivateNetworks bool     `json:"allow_private_networks,omitempty"`
	// Report decides as the policy would but allows what it would deny,
	// recording it (a dry run, from which `policy suggest` learns).
	Report bool      `json:"report,omitempty"`
	Quotas QuotaSpec `json:"quotas,omitzero"`
}

// QuotaSpec is an agent's share of the gateway (policy.Quotas): zero
// means the default, -1 no limit.
type QuotaSpec struct {
	ConnectionsPerSecond float64 `json:"connections_per_second,omitempty"`
	DNSQueriesPerSecond  float64 `json:"dns_queries_per_second,omitempty"`
	BytesPerSecondUp     float64 `json:"bytes_per_second_up,omitempty"`
	BytesPerSecondDown   float64 `json:"bytes_per_second_down,omitempty"`
}

// gatewayPolicy is what the gateway's configuration adds to every
// agent's policy: quotas where the agent's sets none, and DNS-over-HTTPS
// resolvers beside the built-in ones.
type gatewayPolicy struct {
	quotas QuotaSpec
	doh    []string
}

// compile turns the spec into a policy under the gateway's additions; an
// empty mode is open, as the seed's default.
func (p PolicySpec) compile(g gatewayPolicy) (*policy.Policy, error) {
	mode, ask := policy.Open, false
	if p.Mode != "" {
		m, a, err := policy.ParseModeWithAsk(p.Mode)
		if err != nil {
			return nil, err
		}
		mode, ask = m, a
	}
	q := p.Quotas
	for _, f := range []struct{ own, gateway *float64 }{
		{&q.ConnectionsPerSecond, &g.quotas.ConnectionsPerSecond}, {&q.DNSQueriesPerSecond, &g.quotas.DNSQueriesPerSecond},
		{&q.BytesPerSecondUp, &g.quotas.BytesPerSecondUp}, {&q.BytesPerSecondDown, &g.quotas.BytesPerSecondDown},
	} {
		if *f.own == 0 {
			*f.own = *f.gateway
		}
	}
	return policy.New(policy.Config{Mode: mode, Ask: ask, Allow: p.Allow, AllowPrivateNetworks: p.AllowPrivateNetworks, Report: p.Report,
		Quotas: policy.Quotas(q), DoHEndpoints: g.doh})
}

// AgentSpec is what agenthold keeps of an agent.
type AgentSpec struct {
	Name   string     `json:"name"`
	Policy PolicySpec `json:"policy"`
	// NetNS is the path of an existing network namespace to adopt; empty
	// means agenthold creates one.
	NetNS string `json:"netns,omitempty"`
	Index int    `json:"index"` // which network of the pool
	// UID and GID are what exec runs the agent's commands as: the
	// operator's, or given at creation (see server.sandboxIDs).
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
	// Remote agents run elsewhere: no namespace, no uid, no exec; they
	// reach the explicit proxy on egress.remote_listen with a token, of
	// which agenthold keeps the SHA-256 only (set by the server).
	Remote    bool   `json:"remote,omitempty"`
	TokenHash string `json:"token_hash,omitempty"`
}

// agent is a running agent: its spec, its compiled policy, its network.
// Its spec changes only under the registry's lock.
type agent struct {
	spec    AgentSpec
	policy  atomic.Pointer[policy.Policy]
	ns      *netns.NS // the sandbox's namespace
	nsPath  string    // where it is mounted, as this server sees it
	created bool      // agenthold created ns (and removes it)
	gwIface string    // the gateway's end of the veth pair
	uid     uint32
	gid     uint32
	gw4     netip.Addr
	gw6     netip.Addr
	sb4     netip.Addr
	sb6     netip.Addr
	bits4   int // the length of its IPv4 network's prefix
}

var validAgentName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// agents is the registry, persisted in <data_dir>/agents.json. It owns
// its lock: every read and change of its maps and of an agent's spec goes
// through its methods.
type agents struct {
	path   string
	mu     sync.RWMutex
	byID   map[string]*agent
	src    map[netip.Addr]*agent        // sandbox address -> agent
	tokens map[[sha256.Size]byte]*agent // remote agent's token hash -> agent
	saving sync.Mutex                   // one save at a time, each of the registry as it is then
}

func newAgents(dataDir string) *agents {
	return &agents{path: filepath.Join(dataDir, "agents.json"), byID: map[string]*agent{}, src: map[netip.Addr]*agent{}, tokens: map[[sha256.Size]byte]*agent{}}
}

// load reads the persisted specs.
func (as *agents) load() ([]AgentSpec, error) {
	data, err := os.ReadFile(as.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var specs []AgentSpec
	if err := json.Unmarshal(data, &specs); err != nil {
		return nil, fmt.Errorf("%s: %w", as.path, err)
	}
	return specs, nil
}

// save writes the specs atomically. The registry is read under mu, the
// file written after it is released, so that no agent's DNS query or
// connection waits on the disk for another agent's change; saving
// serialises the saves, so that the last written is the newest.
func (as *agents) save() error {
	as.saving.Lock()
	defer as.saving.Unlock()
	as.mu.RLock()
	specs := make([]AgentSpec, 0, len(as.byID))
	for _, a := range as.byID {
		specs = append(specs, a.spec)
	}
	as.mu.RUnlock()
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	data, err := json.MarshalIndent(specs, "", "  ")
	if err != nil {
		return err
	}
	tmp := as.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, as.path)
}

// lookup finds the agent behind a sandbox address, with its policy: the
// AgentFunc of dnsfilter and tproxy.
func (as *agents) lookup(src netip.Addr) (string, *policy.Policy, bool) {
	as.mu.RLock()
	a := as.src[src.Unmap()]
	as.mu.RUnlock()
	if a == nil {
		return "", nil, false
	}
	return a.spec.Name, a.policy.Load(), true
}

func (as *agents) get(name string) *agent {
	as.mu.RLock()
	defer as.mu.RUnlock()
	return as.byID[name]
}

func (as *agents) list() []*agent {
	as.mu.RLock()
	defer as.mu.RUnlock()
	out := make([]*agent, 0, len(as.byID))
	for _, a := range as.byID {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].spec.Name < out[j].spec.Name })
	return out
}

// specOf returns a copy of an agent's spec.
func (as *agents) specOf(a *agent) AgentSpec {
	as.mu.RLock()
	defer as.mu.RUnlock()
	return a.spec
}

// allocate returns spec with a free network index: its own if it is free,
// else the lowest free one.
func (as *agents) allocate(spec AgentSpec, limit int) (AgentSpec, error) {
	as.mu.RLock()
	defer as.mu.RUnlock()
	if _, ok := as.byID[spec.Name]; ok {
		return spec, fmt.Errorf("agent %q %w", spec.Name, errExists)
	}
	if as.indexFreeLocked(spec.Index, limit) {
		return spec, nil
	}
	for i := 0; i < limit; i++ {
		if as.indexFreeLocked(i, limit) {
			spec.Index = i
			return spec, nil
		}
	}
	return spec, errors.New("the network pool is full")
}

// indexFreeLocked reports whether index is in the pool and unused; the
// caller holds mu.
func (as *agents) indexFreeLocked(index, limit int) bool {
	if index < 0 || index >= limit {
		return false
	}
	for _, a := range as.byID {
		if a.spec.Index == index {
			return false
		}
	}
	return true
}

// idsInUse are the uids and gids of the registered agents.
func (as *agents) idsInUse() map[uint32]bool {
	as.mu.RLock()
	defer as.mu.RUnlock()
	used := map[uint32]bool{}
	for _, a := range as.byID {
		used[a.uid], used[a.gid] = true, true
	}
	return used
}

// add registers a wired (or remote) agent and saves the registry.
func (as *agents) add(a *agent) error {
	as.mu.Lock()
	if _, ok := as.byID[a.spec.Name]; ok {
		as.mu.Unlock()
		return fmt.Errorf("agent %q %w", a.spec.Name, errExists)
	}
	as.byID[a.spec.Name] = a
	if a.spec.Remote {
		// A hash that does not decode (an edited registry) is indexed
		// nowhere: no token is the agent's.
		if key, ok := tokenKey(a.spec.TokenHash); ok {
			as.tokens[key] = a
		}
	} else {
		as.src[a.sb4], as.src[a.sb6] = a, a
	}
	as.mu.Unlock()
	return as.save()
}

// tokenKey is a token hash as written in a spec, as the tokens map's key.
func tokenKey(hash string) (key [sha256.Size]byte, ok bool) {
	b, err := hex.DecodeString(hash)
	if err != nil || len(b) != len(key) {
		return key, false
	}
	return [sha256.Size]byte(b), true
}

// byToken finds the remote agent whose token this is, with its policy:
// the one named, or, for a Bearer token (no name), any. It is found by
// the token's SHA-256, in one map lookup whatever the number of agents:
// what a lookup's time could tell is about a hash no one can aim at, and
// an unknown agent and a wrong token are told apart to no one.
func (as *agents) byToken(name, token string) (string, *policy.Policy, error) {
	sum := sha256.Sum256([]byte(token))
	as.mu.RLock()
	defer as.mu.RUnlock()
	a := as.tokens[sum]
	if a == nil || (name != "" && a.spec.Name != name) {
		return "", nil, errBadToken
	}
	return a.spec.Name, a.policy.Load(), nil
}

// remove forgets an agent and saves the registry.
func (as *agents) remove(name string) (*agent, error) {
	as.mu.Lock()
	a := as.byID[name]
	if a == nil {
		as.mu.Unlock()
		return nil, fmt.Errorf("%w %q", errNoAgent, name)
	}
	delete(as.byID, name)
	if a.spec.Remote {
		if key, ok := tokenKey(a.spec.TokenHash); ok {
			delete(as.tokens, key)
		}
	} else {
		delete(as.src, a.sb4)
		delete(as.src, a.sb6)
	}
	as.mu.Unlock()
	return a, as.save()
}

// setPolicy replaces an agent's policy, compiled and as written, and
// saves the registry.
func (as *agents) setPolicy(name string, spec PolicySpec, pol *policy.Policy) error {
	as.mu.Lock()
	a := as.byID[name]
	if a == nil {
		as.mu.Unlock()
		return fmt.Errorf("%w %q", errNoAgent, name)
	}
	a.policy.Store(pol)
	a.spec.Policy = spec
	as.mu.Unlock()
	return as.save()
}

// Errors the admin API maps to status codes.
var (
	errNoAgent  = errors.New("no agent")
	errExists   = errors.New("exists")
	errBadToken = errors.New("unknown agent or wrong token")
)

// dataDirTag is a short hash of the data directory: the namespaces, links
// and nftables table of one server carry it, so two servers never collide
// and a server knows its own leftovers after a crash.
func dataDirTag(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return hex.EncodeToString(sum[:3])
}

// nsName is the name of the namespace agenthold creates for an agent.
func nsName(dataDir, agent string) string { return nsPrefix(dataDir) + agent }

func nsPrefix(dataDir string) string { return "ah-" + dataDirTag(dataDir) + "-" }

// linkName is the gateway's end of an agent's veth pair (at most 14
// bytes: interface names have 15).
func linkName(dataDir string, index int) string { return linkPrefix(dataDir) + strconv.Itoa(index) }

func linkPrefix(dataDir string) string { return "ah" + dataDirTag(dataDir) + "g" }

// tableName is the nftables table of a server, since installing a table
// replaces any of the same name.
func tableName(dataDir string) string { return "agenthold_" + dataDirTag(dataDir) }

// networkAddrs computes an agent's addresses from its index in the pools,
// each agent's IPv4 network bits4 long: the gateway at .2 and ::2, the
// sandbox at .10 and ::10.
func networkAddrs(pool4, pool6 netip.Prefix, bits4, index int) (gw4, sb4, gw6, sb6 netip.Addr) {
	b4 := pool4.Masked().Addr().As4()
	base := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(b4[2])<<8 | uint32(b4[3])
	base += uint32(index) << (32 - bits4)
	at4 := func(host uint32) netip.Addr {
		v := base + host
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	b6 := pool6.Masked().Addr().As16()
	b6[6], b6[7] = byte(index>>8), byte(index)
	at6 := func(host byte) netip.Addr {
		c := b6
		c[15] = host
		return netip.AddrFrom16(c)
	}
	return at4(2), at4(10), at6(2), at6(0x10)
}

// poolSize is how many agent networks the pools hold.
func poolSize(pool4, pool6 netip.Prefix, bits4 int) int {
	return min(1<<(bits4-pool4.Bits()), 1<<(64-pool6.Bits()))
}

// wire creates the agent's namespace, or adopts it (one the operator
// named, or one of its own that outlived a crashed server), and connects
// it to the gateway with a fresh veth pair: the sandbox's default route
// and DNS point at the gateway's address. Wiring an agent twice leaves
// one namespace and one pair.
func wire(ctx context.Context, dataDir string, a *agent) error {
	if a.spec.NetNS != "" {
		if filepath.Dir(a.spec.NetNS) != "/run/netns" {
			return fmt.Errorf("adopt namespace: %s is not under /run/netns", a.spec.NetNS)
		}
		if !netns.IsMounted(a.spec.NetNS) {
			return fmt.Errorf("adopt namespace: %s is not a network namespace", a.spec.NetNS)
		}
		a.ns = &netns.NS{Name: filepath.Base(a.spec.NetNS)}
	} else {
		ns, err := netns.AddOrAdopt(nsName(dataDir, a.spec.Name))
		if err != nil {
			return err
		}
		a.ns, a.created = ns, true
	}
	a.nsPath = a.ns.Path()
	a.gwIface = linkName(dataDir, a.spec.Index)
	// A pair left by a crashed server goes, and with it its sandbox end.
	if netns.LinkExists(a.gwIface) {
		// (or by a deleted agent's namespace, which the kernel tears
		// down in the background: gone meanwhile is gone)
		if err := netns.IP("link", "del", a.gwIface); err != nil && netns.LinkExists(a.gwIface) {
			return err
		}
	}
	// Each side's steps in one ip process: a process of its own per
	// step costs, at a thousand agents, a copy of their mounts each.
	if err := netns.IPBatch([]string{"-batch", "-"},
		[]string{"link", "add", a.gwIface, "type", "veth", "peer", "name", "eth0", "netns", a.ns.Name},
		[]string{"addr", "add", a.gw4.String() + "/" + strconv.Itoa(a.bits4), "dev", a.gwIface},
		[]string{"addr", "add", a.gw6.String() + "/64", "dev", a.gwIface, "nodad"},
		[]string{"link", "set", a.gwIface, "up"},
	); err != nil {
		unwire(a)
		return err
	}
	// Replies to a sandbox address that stops answering neighbour
	// discovery queue only this much on the link before they are
	// dropped: the gateway's sockets are shared by every agent, and their
	// send buffers must not fill with one agent's undeliverable answers.
	for _, family := range []string{"ipv4", "ipv6"} {
		path := filepath.Join("/proc/sys/net", family, "neigh", a.gwIface, "unres_qlen_bytes")
		if err := os.WriteFile(path, []byte(strconv.Itoa(unresolvedQueueBytes)), 0o644); err != nil {
			unwire(a)
			return fmt.Errorf("bound %s's queue for unresolved neighbours: %w", a.gwIface, err)
		}
	}
	// Nor does the gateway take routes from the link (the rules drop
	// router advertisements and redirects from agents before this is
	// asked).
	for _, setting := range []string{"ipv6/conf/%s/accept_ra", "ipv6/conf/%s/accept_redirects", "ipv4/conf/%s/accept_redirects"} {
		path := filepath.Join("/proc/sys/net", fmt.Sprintf(setting, a.gwIface))
		if err := os.WriteFile(path, []byte("0"), 0o644); err != nil {
			unwire(a)
			return fmt.Errorf("take no routes from %s: %w", a.gwIface, err)
		}
	}
	if err := a.ns.IPBatch(
		[]string{"link", "set", "lo", "up"},
		[]string{"addr", "add", a.sb4.String() + "/" + strconv.Itoa(a.bits4), "dev", "eth0"},
		[]string{"addr", "add", a.sb6.String() + "/64", "dev", "eth0", "nodad"},
		[]string{"link", "set", "eth0", "up"},
		[]string{"route", "replace", "default", "via", a.gw4.String()},
		[]string{"route", "replace", "default", "via", a.gw6.String()}, // IPv6, as the address says
	); err != nil {
		unwire(a)
		return err
	}
	if err := a.ns.SetResolvConf(a.resolvConf()); err != nil {
		unwire(a)
		return err
	}
	return nil
}

// unresolvedQueueBytes bounds what an agent link holds for a neighbour
// being resolved (the kernel's default is 212,992 bytes, a whole socket's
// send buffer).
const unresolvedQueueBytes = 16 << 10

// resolvConf is the sandbox's resolv.conf: the gateway's DNS.
func (a *agent) resolvConf() string { return "nameserver " + a.gw4.String() + "\n" }

// unwire removes the veth pair and, if agenthold made it, the namespace.
func unwire(a *agent) {
	// Deleting a namespace agenthold made takes the pair with it (its end
	// there goes, and a veth's ends go together) without the wait for a
	// grace period that deleting the link costs (some 20 ms); a gateway
	// end still there when the index is wired again is removed then.
	if a.created && a.ns != nil && a.ns.Delete() == nil {
		return
	}
	if a.gwIface != "" {
		netns.IP("link", "del", a.gwIface) // also removes the sandbox's end
	}
}

// sweep removes what a crashed server of this data directory left and no
// record names: namespaces (say, of an agent being created when it died)
// and veth pairs.
func sweep(dataDir string, keep []AgentSpec, logf func(msg string, args ...any)) {
	names, links := map[string]bool{}, map[string]bool{}
	for _, s := range keep {
		names[nsName(dataDir, s.Name)] = true
		links[linkName(dataDir, s.Index)] = true
	}
	nsList, _ := netns.List()
	for _, n := range nsList {
		if strings.HasPrefix(n, nsPrefix(dataDir)) && !names[n] {
			logf("removing a namespace no agent owns", "netns", n)
			(&netns.NS{Name: n}).Delete()
		}
	}
	linkList, _ := netns.Links()
	for _, l := range linkList {
		if strings.HasPrefix(l, linkPrefix(dataDir)) && !links[l] {
			logf("removing a link no agent owns", "link", l)
			netns.IP("link", "del", l)
		}
	}
}
