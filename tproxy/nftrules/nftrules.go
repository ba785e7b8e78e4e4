//go:build linux

package nftrules

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// GatewayRules are the rules of gateway mode, installed in the gateway's
// own network namespace: traffic arriving from agent networks (by
// interface, or by source prefix) has its DNS redirected to the DNS port
// and all TCP not addressed to the gateway redirected to the transparent
// proxy; on the gateway itself agents reach only the DNS port, the proxy
// port and the OpenPorts; anything the gateway would have to forward (UDP
// other than DNS, ICMP, QUIC) is dropped. IPv4 and IPv6 alike.
//
// Who may send is decided here, once, before any socket sees a packet:
// an agent's interface admits only the agent's own addresses as source
// ([Link]), for every protocol; ICMPv6 from link-local (or unspecified)
// addresses is the one exception, for neighbour discovery, without which
// IPv6 on the link fails (the input rules then admit only that). Anything else arriving on an agent interface is
// dropped and counted (the "spoofed" counter in the table), so that a
// sandbox that binds another address of its subnet (IPV6_FREEBIND needs
// no privilege) speaks as nobody.
//
// No agent fills the connection tracking table that every agent's flows
// share (when it is full, the kernel drops every agent's new flows): each
// agent interface has a ceiling on new connections and on DNS packets,
// and an agent's closed connections and DNS exchanges are forgotten
// after 10 s, not the kernel's 30 to 120 s.
type GatewayRules struct {
	// Table names the nftables table (family inet); "" means
	// DefaultTable.
	Table string
	// NetNS is the path of the network namespace to install in (such as
	// /run/netns/gw); "" means the caller's.
	NetNS string
	// Links are the agents' interfaces and the addresses each admits as
	// source; more can be added later with Rules.AddLink. Sources are
	// prefixes whose traffic counts as agents' wherever it arrives (no
	// interface of its own: not pinned).
	Links   []Link
	Sources []netip.Prefix
	// AgentPools are the addresses agents are given: a packet from one
	// that arrives other than on an agent interface (from the uplink,
	// say) is dropped, so nothing outside can speak as an agent.
	AgentPools []netip.Prefix
	// DNSPort is where DNS (UDP and TCP 53, to any address) goes.
	DNSPort uint16
	// ProxyPort is where TCP to other hosts goes.
	ProxyPort uint16
	// OpenPorts are the gateway's TCP ports agents may connect to directly
	// (the explicit proxy port, a tunnel port). Like the DNS and proxy
	// ports, they answer agents (and loopback) only.
	OpenPorts []uint16
	// NoNetwork drops everything from agents, DNS included: sandboxes
	// have no network at all. The ports are then not needed.
	NoNetwork bool
	// DNSPacketsPerSecond bounds the UDP DNS packets each agent
	// interface may send, in the kernel, with bursts of twice as many:
	// a ceiling above any agent's own DNS quota (which the DNS server
	// enforces), so that one agent's flood at line rate cannot fill the
	// DNS socket's queue, which every agent shares. Zero means
	// DefaultDNSPacketsPerSecond.
	DNSPacketsPerSecond uint32
	// NewConnectionsPerSecond bounds the new TCP connections each agent
	// interface may begin, in the kernel, with bursts of twice as many:
	// a ceiling above any agent's own connection quota (which the proxy
	// enforces, but only once the handshake has made an entry in the
	// connection tracking table). Zero means
	// DefaultNewConnectionsPerSecond.
	NewConnectionsPerSecond uint32
}

// The timeouts of an agent's flows in the connection tracking table.
// With the interface's ceilings they bound what one agent that connects
// and closes as fast as it may holds of the table to some 50,000 entries
// at the default ceilings (the table holds 262,144 by default on a large
// host); with the kernel's timeouts it would hold it all.
var (
	agentTCPTimeouts = expr.CtStatePolicyTimeout{
		// Until the gateway's SYN-ACK, which a local listener sends at
		// once, or a SYN cookie does.
		expr.CtStateTCPSYNSENT: 10, expr.CtStateTCPSYNRECV: 10, expr.CtStateTCPSYNSENT2: 10,
		// Open connections keep the kernel's defaults: a half-closed
		// one may still carry a long answer.
		expr.CtStateTCPESTABLISHED: 432000, expr.CtStateTCPFINWAIT: 120, expr.CtStateTCPCLOSEWAIT: 60,
		expr.CtStateTCPRETRANS: 300, expr.CtStateTCPUNACK: 300,
		// Closed: both ends are on this host, and no late packet needs
		// the flow's translation back.
		expr.CtStateTCPLASTACK: 10, expr.CtStateTCPTIMEWAIT: 10, expr.CtStateTCPCLOSE: 10,
	}
	// The DNS server answers within its upstream timeout (2 s by
	// default), well inside the unreplied one.
	agentUDPTimeouts = expr.CtStatePolicyTimeout{expr.CtStateUDPUNREPLIED: 10, expr.CtStateUDPREPLIED: 10}

	ctTimeoutMarshal sync.Mutex
)

// SidecarRules are the rules of sidecar mode, installed inside the
// sandbox's own network namespace: every process's outbound TCP except
// the exempt uid's is redirected by destination port (80, 443, anything
// else) to the proxy's three ports, DNS to the DNS port, and everything
// else leaving the namespace is dropped, but for replies to flows others
// began (a server in the Pod answering). Loopback is left alone, so the
// health port is reachable and never redirected. The exempt uid's flows
// are its own: no other uid's packet leaves as one of them, though a
// port the exempt uid closed can be bound by anyone. No socket's packet
// leaves from an address the namespace does not have, so no flow (and
// no reply it lets out) can be begun in an outside host's name.
type SidecarRules struct {
	Table string // "" means DefaultTable
	NetNS string // "" means the caller's
	// ExemptUID is the proxy's own uid, whose traffic is not redirected;
	// zero means DefaultExemptUID (root is never exempt).
	ExemptUID uint32
	// DNSPort, HTTPPort (:80), TLSPort (:443) and OtherPort (other TCP) are
	// the local ports traffic is redirected to; zero means DefaultDNSPort,
	// DefaultHTTPPort, DefaultTLSPort and DefaultOtherPort (the seed's).
	DNSPort, HTTPPort, TLSPort, OtherPort uint16
}

// Link is an agent's interface on the gateway, and the addresses its
// agent sends from. An interface admits no other source: a Link without
// addresses admits only neighbour discovery.
type Link struct {
	Interface string
	Addrs     []netip.Addr
}

// Rules is an installed table. Close removes it. If the process dies
// without Close, the table stays: redirected traffic meets closed ports and
// forwarding stays dropped, so sandboxes lose the network, never gain it.
type Rules struct {
	mu     sync.Mutex
	conn   *nftables.Conn
	table  *nftables.Table
	ifaces *nftables.Set // nil in sidecar mode
	// pinned4 and pinned6 hold interface . source address pairs: the
	// sources each agent interface admits (gateway mode).
	pinned4, pinned6 *nftables.Set
	links            map[string][]netip.Addr // the pairs, by interface, to remove them
	netns            *os.File
	closed           bool
}

// Defaults for the rules' zero fields: the table, and the sidecar seed's
// ports and uid.
const (
	DefaultTable               = "egress"
	DefaultDNSPacketsPerSecond = 2000
	// DefaultNewConnectionsPerSecond is ten times policy's default
	// connection quota, above what one agent reached on a 2-core host.
	DefaultNewConnectionsPerSecond = 5000
	DefaultExemptUID               = 1337
	DefaultDNSPort                 = 15053
	DefaultHTTPPort                = 15001
	DefaultTLSPort                 = 15002
	DefaultOtherPort               = 15003
)

const (
	chainAgentNAT = "agent_nat"
	chainAgentIn  = "agent_in"
	chainAgentSrc = "agent_src"
	// counterSpoofed counts the packets dropped for a source their
	// interface does not admit.
	counterSpoofed = "spoofed"
	// The connection tracking timeouts of agents' flows.
	timeoutAgentTCP = "agent_tcp"
	timeoutAgentUDP = "agent_udp"
)

// Apply installs the gateway rules as one batch, replacing a table of the
// same name.
func (g GatewayRules) Apply() (*Rules, error) {
	if !g.NoNetwork && (g.DNSPort == 0 || g.ProxyPort == 0) {
		return nil, errors.New("nftrules: gateway rules need a DNS port and a proxy port")
	}
	r, err := openRules(g.NetNS, cmp.Or(g.Table, DefaultTable))
	if err != nil {
		return nil, err
	}
	if err := g.build(r); err != nil {
		r.release()
		return nil, err
	}
	if err := r.conn.Flush(); err != nil {
		r.release()
		return nil, fmt.Errorf("nftrules: install gateway rules: %w", err)
	}
	return r, nil
}

// Apply installs the sidecar rules as one batch, replacing a table of the
// same name.
func (sc SidecarRules) Apply() (*Rules, error) {
	r, err := openRules(sc.NetNS, cmp.Or(sc.Table, DefaultTable))
	if err != nil {
		return nil, err
	}
	sc.build(r)
	if err := r.conn.Flush(); err != nil {
		r.release()
		return nil, fmt.Errorf("nftrules: install sidecar rules: %w", err)
	}
	return r, nil
}

// openRules opens an nftables connection in a namespace; extra options
// (a test's recording dialer) come after the namespace's.
func openRules(netnsPath, table string, extra ...nftables.ConnOption) (*Rules, error) {
	r := &Rules{table: &nftables.Table{Family: nftables.TableFamilyINet, Name: table}}
	var opts []nftables.ConnOption
	if netnsPath != "" {
		f, err := os.Open(netnsPath)
		if err != nil {
			return nil, fmt.Errorf("nftrules: open network namespace: %w", err)
		}
		r.netns = f
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	c, err := nftables.New(append(opts, extra...)...)
	if err != nil {
		r.release()
		return nil, fmt.Errorf("nftrules: nftables: %w", err)
	}
	r.conn = c
	return r, nil
}

func (r *Rules) release() {
	if r.netns != nil {
		r.netns.Close()
		r.netns = nil
	}
}

// replaceTable starts the batch by removing any table of the same name (a
// crashed run's), so the new rules never add to old ones.
func (r *Rules) replaceTable() {
	r.conn.AddTable(r.table)
	r.conn.DelTable(r.table)
	r.conn.AddTable(r.table)
}

func (g GatewayRules) build(r *Rules) error {
	c, t := r.conn, r.table
	r.replaceTable()
	r.ifaces = &nftables.Set{Table: t, Name: "agent_ifaces", KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian}
	r.pinned4 = &nftables.Set{Table: t, Name: "agent_pinned4", Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	r.pinned6 = &nftables.Set{Table: t, Name: "agent_pinned6", Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)}
	r.links = map[string][]netip.Addr{}
	var ifaces, pinned4, pinned6 []nftables.SetElement
	for _, l := range g.Links {
		ifaces = append(ifaces, nftables.SetElement{Key: ifname(l.Interface)})
		p4, p6 := pinnedElements(l)
		pinned4, pinned6 = append(pinned4, p4...), append(pinned6, p6...)
		r.links[l.Interface] = slices.Clone(l.Addrs)
	}
	for _, set := range []struct {
		s     *nftables.Set
		elems []nftables.SetElement
	}{{r.ifaces, ifaces}, {r.pinned4, pinned4}, {r.pinned6, pinned6}} {
		if err := c.AddSet(set.s, set.elems); err != nil {
			return fmt.Errorf("nftrules: set %s: %w", set.s.Name, err)
		}
	}
	src4, src6, err := addPrefixSets(c, t, "agent_src", g.Sources)
	if err != nil {
		return err
	}
	pool4, pool6, err := addPrefixSets(c, t, "agent_pool", g.AgentPools)
	if err != nil {
		return err
	}

	agentNAT := c.AddChain(&nftables.Chain{Name: chainAgentNAT, Table: t})
	agentIn := c.AddChain(&nftables.Chain{Name: chainAgentIn, Table: t})
	agentSrc := c.AddChain(&nftables.Chain{Name: chainAgentSrc, Table: t})
	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Source pinning, before anything judges a source (at the raw
	// priority, ahead of conntrack): a packet on an agent interface must
	// come from an address of that interface's agent.
	spoof := c.AddChain(&nftables.Chain{Name: "agent_spoof", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	spoofed := c.AddObj(&nftables.CounterObj{Table: t, Name: counterSpoofed})
	c.AddRule(&nftables.Rule{Table: t, Chain: spoof, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, lookup(r.ifaces), jump(chainAgentSrc),
	}})
	for _, m := range [][]expr.Any{
		append(nfproto(unix.NFPROTO_IPV4), &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, lookup(r.pinned4)),
		append(nfproto(unix.NFPROTO_IPV6), &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}, lookup(r.pinned6)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: agentSrc, Exprs: append(m, &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	// ICMPv6 from link-local or unspecified addresses: the link's own
	// business (neighbour discovery, which agent_in admits; multicast
	// listener reports, which it drops), not a source to judge.
	for _, from := range []netip.Prefix{netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("::/128")} {
		m := append(append(nfproto(unix.NFPROTO_IPV6), l4(unix.IPPROTO_ICMPV6, 0)...),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16})
		m = append(append(m, prefixMatch(from, 1)...), &expr.Verdict{Kind: expr.VerdictReturn})
		c.AddRule(&nftables.Rule{Table: t, Chain: agentSrc, Exprs: m})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: agentSrc, Exprs: []expr.Any{
		&expr.Objref{Type: objectCounter, Name: spoofed.(*nftables.CounterObj).Name}, drop(),
	}})
	// And an agent's address arrives only on an agent interface (or on
	// loopback, when the host speaks to its own end of an agent's link).
	c.AddRule(&nftables.Rule{Table: t, Chain: spoof, Exprs: loopbackIn()})
	for _, m := range [][]expr.Any{
		append(nfproto(unix.NFPROTO_IPV4), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, lookup(pool4)),
		append(nfproto(unix.NFPROTO_IPV6), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}, lookup(pool6)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: spoof, Exprs: append(m,
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, notLookup(r.ifaces), drop())})
	}

	// Which traffic is an agent's: by interface or by source.
	fromAgent := [][]expr.Any{
		{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, lookup(r.ifaces)},
		append(nfproto(unix.NFPROTO_IPV4), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, lookup(src4)),
		append(nfproto(unix.NFPROTO_IPV6), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}, lookup(src6)),
	}
	for _, m := range fromAgent {
		c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: append(m, jump(chainAgentNAT))})
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append(m, jump(chainAgentIn))})
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append(m, drop())})
	}
	// Nothing is forwarded to agents either.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, lookup(r.ifaces), drop()}})
	// The gateway's own ports answer agents only (and the host itself, on
	// loopback): nothing on the uplink side can resolve or connect through
	// the gateway.
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: loopbackIn()})
	// (With NoNetwork too: the listeners may run all the same.)
	if g.DNSPort != 0 {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append(l4(unix.IPPROTO_UDP, g.DNSPort), drop())})
	}
	for _, p := range append([]uint16{g.DNSPort, g.ProxyPort}, g.OpenPorts...) {
		if p != 0 {
			c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append(l4(unix.IPPROTO_TCP, p), drop())})
		}
	}

	if g.NoNetwork {
		c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: []expr.Any{drop()}})
		return nil
	}
	// agent_nat: DNS to the DNS port; TCP not to the gateway to the proxy.
	c.AddRule(&nftables.Rule{Table: t, Chain: agentNAT, Exprs: redirectPort(unix.IPPROTO_UDP, 53, g.DNSPort)})
	c.AddRule(&nftables.Rule{Table: t, Chain: agentNAT, Exprs: redirectPort(unix.IPPROTO_TCP, 53, g.DNSPort)})
	c.AddRule(&nftables.Rule{Table: t, Chain: agentNAT, Exprs: []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		&expr.Verdict{Kind: expr.VerdictReturn},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: agentNAT, Exprs: redirectPort(unix.IPPROTO_TCP, 0, g.ProxyPort)})

	// agent_in: DNS within its kernel ceiling (before the established
	// rule: a UDP flow is established after its first answer), replies,
	// IPv6 neighbour discovery, the named ports; else drop.
	if err := perInterfaceCeiling(c, agentIn, "dns_rate", cmp.Or(g.DNSPacketsPerSecond, DefaultDNSPacketsPerSecond),
		l4(unix.IPPROTO_UDP, g.DNSPort), nil); err != nil {
		return err
	}
	// New TCP connections on agent interfaces within their ceiling; then
	// every new flow of an agent's gets its timeouts, before the flow is
	// confirmed in the table (at the end of this hook).
	if err := perInterfaceCeiling(c, agentIn, "conn_rate", cmp.Or(g.NewConnectionsPerSecond, DefaultNewConnectionsPerSecond),
		ctNew(unix.IPPROTO_TCP), r.ifaces); err != nil {
		return err
	}
	for _, tm := range []struct {
		name   string
		proto  byte
		policy expr.CtStatePolicyTimeout
	}{{timeoutAgentTCP, unix.IPPROTO_TCP, agentTCPTimeouts}, {timeoutAgentUDP, unix.IPPROTO_UDP, agentUDPTimeouts}} {
		// expr.CtTimeout writes its policy into the library's map of
		// defaults as it marshals: one at a time.
		ctTimeoutMarshal.Lock()
		c.AddObj(&nftables.NamedObj{Table: t, Name: tm.name, Type: nftables.ObjTypeCtTimeout,
			Obj: &expr.CtTimeout{L3Proto: unix.NFPROTO_INET, L4Proto: tm.proto, Policy: tm.policy}})
		ctTimeoutMarshal.Unlock()
		c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: append(ctNew(tm.proto),
			&expr.Objref{Type: int(nftables.ObjTypeCtTimeout), Name: tm.name})})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: established()})
	for _, nd := range neighbourDiscovery() {
		c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: nd})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: acceptPort(unix.IPPROTO_UDP, g.DNSPort)})
	for _, p := range append([]uint16{g.DNSPort, g.ProxyPort}, g.OpenPorts...) {
		c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: acceptPort(unix.IPPROTO_TCP, p)})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: agentIn, Exprs: []expr.Any{drop()}})
	return nil
}

func (sc SidecarRules) build(r *Rules) {
	c, t := r.conn, r.table
	r.replaceTable()
	uid := sc.ExemptUID
	if uid == 0 {
		uid = DefaultExemptUID
	}
	port := func(p, def uint16) uint16 {
		if p != 0 {
			return p
		}
		return def
	}
	exempt := []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uid)},
	}
	loopback := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
	}
	nat := c.AddChain(&nftables.Chain{Name: "output_nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: append(exempt, &expr.Verdict{Kind: expr.VerdictReturn})})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: append(loopback, &expr.Verdict{Kind: expr.VerdictReturn})})
	dns := port(sc.DNSPort, DefaultDNSPort)
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: redirectPort(unix.IPPROTO_UDP, 53, dns)})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: redirectPort(unix.IPPROTO_TCP, 53, dns)})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: redirectPort(unix.IPPROTO_TCP, 80, port(sc.HTTPPort, DefaultHTTPPort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: redirectPort(unix.IPPROTO_TCP, 443, port(sc.TLSPort, DefaultTLSPort))})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: redirectPort(unix.IPPROTO_TCP, 0, port(sc.OtherPort, DefaultOtherPort))})

	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: append(exempt, &expr.Verdict{Kind: expr.VerdictAccept})})
	for _, r := range foreignSource() {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: r})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: append(loopback, &expr.Verdict{Kind: expr.VerdictAccept})})
	// What the nat chain redirected: the output interface a filter chain
	// sees is still the one before the redirect, so match the NAT itself.
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: redirected()})
	// Other uids' packets of established flows leave only as replies
	// (a server in the Pod answering): the exempt uid's flows outlive
	// its sockets in conntrack, and a packet another uid sends from a
	// port it closed joins them, unseen by the nat chain (which sees a
	// flow's first packet only). The cost: the kernel's own packets on
	// the exempt uid's flows (a reset for a socket already gone, a
	// time-wait socket's ACK) have no uid and stay in too.
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: replies()})
	for _, nd := range neighbourDiscovery() {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: nd})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: []expr.Any{drop()}})
}

// objectCounter is NFT_OBJECT_COUNTER, the type of a named counter, and
// dynsetUpdate NFT_DYNSET_OP_UPDATE, which adds an element or refreshes
// it.
const (
	objectCounter = 1
	dynsetUpdate  = 1
)

// AddLink adds an agent's interface and the sources it admits (gateway
// mode). Adding an interface again replaces its addresses.
func (r *Rules) AddLink(l Link) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if old, ok := r.links[l.Interface]; ok {
		r.deletePinned(Link{Interface: l.Interface, Addrs: old})
	}
	if err := r.conn.SetAddElements(r.ifaces, []nftables.SetElement{{Key: ifname(l.Interface)}}); err != nil {
		return fmt.Errorf("nftrules: add interface %s: %w", l.Interface, err)
	}
	p4, p6 := pinnedElements(l)
	for _, set := range []struct {
		s     *nftables.Set
		elems []nftables.SetElement
	}{{r.pinned4, p4}, {r.pinned6, p6}} {
		if len(set.elems) == 0 {
			continue
		}
		if err := r.conn.SetAddElements(set.s, set.elems); err != nil {
			return fmt.Errorf("nftrules: pin %s: %w", l.Interface, err)
		}
	}
	if err := r.conn.Flush(); err != nil {
		return fmt.Errorf("nftrules: add interface %s: %w", l.Interface, err)
	}
	r.links[l.Interface] = slices.Clone(l.Addrs)
	return nil
}

// RemoveLink removes an agent's interface and its pinned sources
// (gateway mode).
func (r *Rules) RemoveLink(iface string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	if addrs, ok := r.links[iface]; ok {
		r.deletePinned(Link{Interface: iface, Addrs: addrs})
	}
	if err := r.conn.SetDeleteElements(r.ifaces, []nftables.SetElement{{Key: ifname(iface)}}); err != nil {
		return fmt.Errorf("nftrules: remove interface %s: %w", iface, err)
	}
	if err := r.conn.Flush(); err != nil {
		return fmt.Errorf("nftrules: remove interface %s: %w", iface, err)
	}
	delete(r.links, iface)
	return nil
}

func (r *Rules) usable() error {
	if r.closed || r.ifaces == nil {
		return errors.New("nftrules: no agent interfaces (closed, or sidecar rules)")
	}
	return nil
}

// deletePinned queues the removal of a link's pinned pairs, for the next
// flush.
func (r *Rules) deletePinned(l Link) {
	p4, p6 := pinnedElements(l)
	if len(p4) > 0 {
		r.conn.SetDeleteElements(r.pinned4, p4)
	}
	if len(p6) > 0 {
		r.conn.SetDeleteElements(r.pinned6, p6)
	}
}

// Spoofed is how many packets arrived on an agent interface from a source
// it does not admit (gateway mode).
func (r *Rules) Spoofed() (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return 0, err
	}
	o, err := r.conn.GetObject(&nftables.CounterObj{Table: r.table, Name: counterSpoofed})
	if err != nil {
		return 0, fmt.Errorf("nftrules: read counter %s: %w", counterSpoofed, err)
	}
	c, ok := o.(*nftables.CounterObj)
	if !ok {
		return 0, fmt.Errorf("nftrules: counter %s is a %T", counterSpoofed, o)
	}
	return c.Packets, nil
}

// pinnedElements are the interface . address keys of a link, IPv4 and
// IPv6 (IPv4-mapped addresses as IPv4).
func pinnedElements(l Link) (v4, v6 []nftables.SetElement) {
	for _, a := range l.Addrs {
		a = a.Unmap()
		key := append(ifname(l.Interface), a.AsSlice()...)
		if a.Is4() {
			v4 = append(v4, nftables.SetElement{Key: key})
		} else {
			v6 = append(v6, nftables.SetElement{Key: key})
		}
	}
	return v4, v6
}

// Close removes the table. It is safe to call more than once.
func (r *Rules) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	defer r.release()
	r.conn.DelTable(r.table)
	if err := r.conn.Flush(); err != nil {
		return fmt.Errorf("nftrules: remove table %s: %w", r.table.Name, err)
	}
	return nil
}

// ifname pads an interface name as nftables stores it (IFNAMSIZ bytes).
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// prefixElements are the interval-set elements of a prefix: its start, and
// the address after its end flagged as the end of the interval.
func prefixElements(p netip.Prefix) []nftables.SetElement {
	start := p.Addr()
	last := start.AsSlice()
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	end, _ := netip.AddrFromSlice(last)
	elems := []nftables.SetElement{{Key: start.AsSlice()}}
	if next := end.Next(); next.IsValid() {
		elems = append(elems, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
	}
	return elems
}

// addPrefixSets adds two interval sets, name+"4" and name+"6", holding the
// IPv4 and the IPv6 prefixes.
func addPrefixSets(c *nftables.Conn, t *nftables.Table, name string, prefixes []netip.Prefix) (v4set, v6set *nftables.Set, err error) {
	v4set = &nftables.Set{Table: t, Name: name + "4", KeyType: nftables.TypeIPAddr, Interval: true}
	v6set = &nftables.Set{Table: t, Name: name + "6", KeyType: nftables.TypeIP6Addr, Interval: true}
	var v4, v6 []nftables.SetElement
	for _, p := range prefixes {
		p = p.Masked()
		if p.Addr().Is4() {
			v4 = append(v4, prefixElements(p)...)
		} else {
			v6 = append(v6, prefixElements(p)...)
		}
	}
	if err := c.AddSet(v4set, v4); err != nil {
		return nil, nil, fmt.Errorf("nftrules: set %s: %w", v4set.Name, err)
	}
	if err := c.AddSet(v6set, v6); err != nil {
		return nil, nil, fmt.Errorf("nftrules: set %s: %w", v6set.Name, err)
	}
	return v4set, v6set, nil
}

// loopbackIn accepts what arrives on loopback.
func loopbackIn() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// notLookup matches what register 1 holds when it is not in s.
func notLookup(s *nftables.Set) expr.Any {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: true}
}

func lookup(s *nftables.Set) expr.Any {
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}
}

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func drop() expr.Any { return &expr.Verdict{Kind: expr.VerdictDrop} }

func nfproto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// l4 matches a transport protocol and, when port is not zero, a
// destination port.
func l4(proto byte, port uint16) []expr.Any {
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
	if port != 0 {
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		)
	}
	return e
}

// redirectPort redirects proto (to dport, or any port when zero) to a
// local port.
func redirectPort(proto byte, dport, to uint16) []expr.Any {
	return append(l4(proto, dport),
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(to)},
		&expr.Redir{RegisterProtoMin: 1},
	)
}

func acceptPort(proto byte, port uint16) []expr.Any {
	return append(l4(proto, port), &expr.Verdict{Kind: expr.VerdictAccept})
}

// perInterfaceCeiling adds a rule to chain that drops the packets match
// picks out beyond rate a second, with bursts of twice as many, for each
// input interface (of the set within, if not nil) on its own: a dynamic
// set of that name keeps each interface's limit.
func perInterfaceCeiling(c *nftables.Conn, chain *nftables.Chain, name string, rate uint32, match []expr.Any, within *nftables.Set) error {
	set := &nftables.Set{Table: chain.Table, Name: name, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian,
		Dynamic: true, HasTimeout: true, Timeout: time.Minute}
	if err := c.AddSet(set, nil); err != nil {
		return fmt.Errorf("nftrules: set %s: %w", name, err)
	}
	exprs := append(match, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1})
	if within != nil {
		exprs = append(exprs, lookup(within))
	}
	c.AddRule(&nftables.Rule{Table: chain.Table, Chain: chain, Exprs: append(exprs,
		&expr.Dynset{SrcRegKey: 1, SetName: set.Name, SetID: set.ID, Operation: dynsetUpdate, Exprs: []expr.Any{
			&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(rate), Over: true, Unit: expr.LimitTimeSecond, Burst: 2 * rate},
		}},
		drop())})
	return nil
}

// ctNew matches the first packet of a flow of protocol proto.
func ctNew(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// replies accepts packets of established (or related) flows sent in the
// reply direction: answers to a flow another host began.
func replies() []expr.Any {
	const dirReply = 1 // IP_CT_DIR_REPLY
	return append(established()[:3:3],
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{dirReply}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	)
}

// foreignSource drops, in a rule for each family, a socket's packet whose
// source is not an address of the namespace. A freebind socket
// (IPV6_FREEBIND needs no privilege) may send from any address: over
// loopback, "from" a host outside "to" the Pod, it would leave conntrack
// a flow that host began, whose replies (the sandbox's own packets to
// that host, which the nat chain never sees as a flow's first) the rules
// let out. Packets with no socket are not judged here (the socket's uid
// is read first, and without one the rule stops), nor those from the
// unspecified address, from which the kernel's own sockets send duplicate
// address detection and multicast listener reports, and to which no
// reply can come.
func foreignSource() [][]expr.Any {
	rule := func(family byte, offset uint32, unspecified []byte) []expr.Any {
		return append(nfproto(family),
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(unspecified))},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: unspecified},
			&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
			drop(),
		)
	}
	return [][]expr.Any{
		rule(unix.NFPROTO_IPV4, 12, make([]byte, 4)),
		rule(unix.NFPROTO_IPV6, 8, make([]byte, 16)),
	}
}

// redirected accepts packets of connections whose destination was
// rewritten (ct status dnat), that is, redirected to the proxy.
func redirected() []expr.Any {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT in linux/netfilter/nf_conntrack_common.h
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// neighbourDiscovery accepts, in two rules, ICMPv6 router solicitations
// (type 133) and neighbour solicitations and advertisements (135, 136),
// without which IPv6 on a link fails. Never a router advertisement (134)
// or a redirect (137): a sandbox with a raw socket (root in a container
// runtime's namespace) would make itself the other end's router, and
// move the routes of every agent's upstream traffic onto its own link.
func neighbourDiscovery() [][]expr.Any {
	icmpType := func(from, to byte) []expr.Any {
		return append(l4(unix.IPPROTO_ICMPV6, 0),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{from}, ToData: []byte{to}},
			&expr.Verdict{Kind: expr.VerdictAccept},
		)
	}
	return [][]expr.Any{icmpType(133, 133), icmpType(135, 136)}
}

// prefixMatch matches the address in register reg against p.
func prefixMatch(p netip.Prefix, reg uint32) []expr.Any {
	addr := p.Masked().Addr().AsSlice()
	mask := make([]byte, len(addr))
	for i := range p.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: addr},
	}
}
