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
	"sync"
	"sync/atomic"

	"github.com/agenthold/egress/internal/netns"
	"github.com/agenthold/egress/policy"
)

// PolicySpec is an agent's network policy as admins set it.
type PolicySpec struct {
	Mode                 string   `json:"mode"` // open (default) or allowlist
	Allow                []string `json:"allow,omitempty"`
	AllowPrivateNetworks bool     `json:"allow_private_networks,omitempty"`
}

// compile turns the spec into a policy; an empty mode is open, as the
// seed's default.
func (p PolicySpec) compile() (*policy.Policy, error) {
	mode := policy.Open
	if p.Mode != "" {
		m, err := policy.ParseMode(p.Mode)
		if err != nil {
			return nil, err
		}
		mode = m
	}
	return policy.New(policy.Config{Mode: mode, Allow: p.Allow, AllowPrivateNetworks: p.AllowPrivateNetworks})
}

// AgentSpec is what agenthold keeps of an agent.
type AgentSpec struct {
	Name   string     `json:"name"`
	Policy PolicySpec `json:"policy"`
	// NetNS is the path of an existing network namespace to adopt; empty
	// means agenthold creates one.
	NetNS string `json:"netns,omitempty"`
	Index int    `json:"index"` // which network of the pool
}

// agent is a running agent: its spec, its compiled policy, its network.
type agent struct {
	spec    AgentSpec
	policy  atomic.Pointer[policy.Policy]
	ns      *netns.NS // the sandbox's namespace
	created bool      // agenthold created ns (and removes it)
	gwIface string    // the gateway's end of the veth pair
	gw4     netip.Addr
	gw6     netip.Addr
	sb4     netip.Addr
	sb6     netip.Addr
}

var validAgentName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// agents is the registry, persisted in <data_dir>/agents.json.
type agents struct {
	path string
	mu   sync.RWMutex
	byID map[string]*agent
	src  map[netip.Addr]*agent // sandbox address -> agent
}

func newAgents(dataDir string) *agents {
	return &agents{path: filepath.Join(dataDir, "agents.json"), byID: map[string]*agent{}, src: map[netip.Addr]*agent{}}
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

// save writes the specs atomically; the caller holds mu.
func (as *agents) save() error {
	specs := make([]AgentSpec, 0, len(as.byID))
	for _, a := range as.byID {
		specs = append(specs, a.spec)
	}
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

// freeIndex returns the lowest network index not in use; the caller
// holds mu.
func (as *agents) freeIndex(limit int) (int, error) {
	for i := 0; i < limit; i++ {
		if as.indexFree(i, limit) {
			return i, nil
		}
	}
	return 0, errors.New("the network pool is full")
}

// indexFree reports whether index is in the pool and unused; the caller
// holds mu.
func (as *agents) indexFree(index, limit int) bool {
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

// nsName is the name of the namespace agenthold creates for an agent:
// unique per data directory, so that two servers never collide.
func nsName(dataDir, agent string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return "ah-" + hex.EncodeToString(sum[:3]) + "-" + agent
}

// tableName is the nftables table of a server: unique per data directory,
// since installing a table replaces any of the same name.
func tableName(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return "agenthold_" + hex.EncodeToString(sum[:3])
}

// networkAddrs computes an agent's addresses from its index in the pools:
// the gateway at .2 and ::2, the sandbox at .10 and ::10.
func networkAddrs(pool4, pool6 netip.Prefix, index int) (gw4, sb4, gw6, sb6 netip.Addr) {
	b4 := pool4.Masked().Addr().As4()
	base := uint32(b4[0])<<24 | uint32(b4[1])<<16 | uint32(b4[2])<<8 | uint32(b4[3])
	base += uint32(index) << 8
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
func poolSize(pool4, pool6 netip.Prefix) int {
	return min(1<<(24-pool4.Bits()), 1<<(64-pool6.Bits()))
}

// wire creates (or adopts) the agent's namespace and connects it to the
// gateway with a veth pair: the sandbox's default route and DNS point at
// the gateway's address.
func wire(ctx context.Context, dataDir string, a *agent) error {
	name := nsName(dataDir, a.spec.Name)
	if a.spec.NetNS != "" {
		a.ns = &netns.NS{Name: filepath.Base(a.spec.NetNS)}
		if _, err := os.Stat(a.spec.NetNS); err != nil {
			return fmt.Errorf("adopt namespace: %w", err)
		}
		if filepath.Dir(a.spec.NetNS) != "/run/netns" {
			return fmt.Errorf("adopt namespace: %s is not under /run/netns", a.spec.NetNS)
		}
	} else {
		ns, err := netns.Add(name)
		if err != nil {
			return err
		}
		a.ns, a.created = ns, true
	}
	a.gwIface = fmt.Sprintf("ahgw%d", a.spec.Index)
	steps := [][]string{
		{"link", "add", a.gwIface, "type", "veth", "peer", "name", "eth0", "netns", a.ns.Name},
		{"addr", "add", a.gw4.String() + "/24", "dev", a.gwIface},
		{"addr", "add", a.gw6.String() + "/64", "dev", a.gwIface, "nodad"},
		{"link", "set", a.gwIface, "up"},
	}
	for _, s := range steps {
		if err := netns.IP(s...); err != nil {
			unwire(a)
			return err
		}
	}
	sandbox := [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", a.sb4.String() + "/24", "dev", "eth0"},
		{"addr", "add", a.sb6.String() + "/64", "dev", "eth0", "nodad"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", a.gw4.String()},
		{"-6", "route", "add", "default", "via", a.gw6.String()},
	}
	for _, s := range sandbox {
		if err := a.ns.IP(s...); err != nil {
			unwire(a)
			return err
		}
	}
	if err := a.ns.SetResolvConf("nameserver " + a.gw4.String() + "\n"); err != nil {
		unwire(a)
		return err
	}
	return nil
}

// unwire removes the veth pair and, if agenthold made it, the namespace.
func unwire(a *agent) {
	if a.gwIface != "" {
		netns.IP("link", "del", a.gwIface) // also removes the sandbox's end
	}
	if a.created && a.ns != nil {
		a.ns.Delete()
	}
}
