package netguard

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/agenthold/egress/internal/prefixmap"
)

// Tier is how far an address may be trusted as a destination. The zero Tier
// is Never, so an unset or unknown tier denies.
type Tier uint8

const (
	// Never: loopback, link-local, cloud metadata, multicast, reserved and
	// every other block that is not globally reachable, the gateway's own
	// addresses, and the operator's never prefixes. Never dialled.
	Never Tier = iota
	// Private: RFC 1918, unique local IPv6 and CGNAT. Dialled only when the
	// caller allows private networks.
	Private
	// Public: globally reachable.
	Public
)

func (t Tier) String() string {
	switch t {
	case Never:
		return "never"
	case Private:
		return "private"
	case Public:
		return "public"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

// Class is the classification of one address: its tier and why.
type Class struct {
	Tier   Tier
	Reason string // e.g. "loopback (RFC 1122), 127.0.0.0/8"
}

// Permits reports whether an address of this class may be dialled. Private
// addresses need allowPrivate; Never is never permitted; an unknown tier
// is not permitted.
func (c Class) Permits(allowPrivate bool) bool {
	return c.Tier == Public || (c.Tier == Private && allowPrivate)
}

func (c Class) String() string { return c.Tier.String() + ": " + c.Reason }

// class is a map value: a Class and whether it is hard, that is whether a
// more specific public prefix may not lift it (metadata, the operator's
// never prefixes, the gateway's own addresses).
type class struct {
	Class
	hard bool
}

func mergeClass(outer, inner class) class {
	if outer.hard {
		return outer
	}
	return inner
}

// Config names the operator's additions to the built-in classification.
type Config struct {
	// Public lists prefixes that count as public although the registry
	// says otherwise: an internal mirror, a test network. It does not lift
	// cloud metadata addresses, Never prefixes or the gateway's own
	// addresses.
	Public []netip.Prefix
	// Private lists prefixes that count as private: dialled only for
	// agents allowed private networks (a cluster's service range, a
	// corporate network in public address space). Like Public, it does
	// not lift cloud metadata addresses, Never prefixes or the gateway's
	// own addresses.
	Private []netip.Prefix
	// Never lists prefixes that are never dialled, whatever else applies.
	Never []netip.Prefix
}

// Guard classifies addresses and guards dials. The zero Guard uses the
// built-in classification only. A Guard is safe for concurrent use.
type Guard struct {
	table *prefixmap.Map[class]                // nil means builtinTable()
	own   atomic.Pointer[prefixmap.Map[class]] // the gateway's own addresses
}

var builtinTable = sync.OnceValue(func() *prefixmap.Map[class] {
	return prefixmap.New(builtinEntries(), mergeClass)
})

// New returns a Guard with the operator's additions.
func New(cfg Config) (*Guard, error) {
	entries := builtinEntries()
	for _, p := range cfg.Public {
		if !p.IsValid() {
			return nil, fmt.Errorf("netguard: invalid public prefix %q", p)
		}
		entries = append(entries, prefixmap.Entry[class]{Prefix: p, Value: class{Class{Public, "declared public by the operator, " + p.String()}, false}})
	}
	for _, p := range cfg.Private {
		if !p.IsValid() {
			return nil, fmt.Errorf("netguard: invalid private prefix %q", p)
		}
		entries = append(entries, prefixmap.Entry[class]{Prefix: p, Value: class{Class{Private, "declared private by the operator, " + p.String()}, false}})
	}
	for _, p := range cfg.Never {
		if !p.IsValid() {
			return nil, fmt.Errorf("netguard: invalid never prefix %q", p)
		}
		entries = append(entries, prefixmap.Entry[class]{Prefix: p, Value: class{Class{Never, "declared never by the operator, " + p.String()}, true}})
	}
	return &Guard{table: prefixmap.New(entries, mergeClass)}, nil
}

// SetOwn replaces the set of the gateway's own addresses, which are never
// dialled so that the gateway never connects to itself. [Guard.FollowLocal]
// keeps them equal to the host's; a caller that sets them itself calls it
// again whenever they change.
func (g *Guard) SetOwn(own []netip.Prefix) {
	entries := make([]prefixmap.Entry[class], 0, len(own))
	for _, p := range own {
		entries = append(entries, prefixmap.Entry[class]{Prefix: p, Value: class{Class{Never, "the gateway's own address, " + p.String()}, true}})
	}
	g.own.Store(prefixmap.New(entries, nil))
}

func (g *Guard) lookupTable() *prefixmap.Map[class] {
	if g == nil || g.table == nil {
		return builtinTable()
	}
	return g.table
}

// Classify returns the tier of a and why. IPv4-mapped IPv6 is unmapped
// first; IPv6 forms that embed an IPv4 address (NAT64, 6to4, Teredo,
// IPv4-compatible, IPv4-translated) are as strict as the stricter of the
// block and the address they embed. An invalid address is Never.
func (g *Guard) Classify(a netip.Addr) Class {
	if !a.IsValid() {
		return Class{Never, "invalid address"}
	}
	a = a.WithZone("").Unmap()
	c := g.classifyOne(a)
	if !a.Is6() || c.Tier == Never {
		return c
	}
	kind, v4, n := embeddedIPv4(a)
	for _, e := range v4[:n] {
		if ec := g.classifyOne(e); ec.Tier < c.Tier {
			c = Class{ec.Tier, kind + " address embedding " + e.String() + ": " + ec.Reason}
		}
	}
	return c
}

func (g *Guard) classifyOne(a netip.Addr) Class {
	if g != nil {
		if c, ok := g.own.Load().Lookup(a); ok {
			return c.Class
		}
	}
	if c, ok := g.lookupTable().Lookup(a); ok {
		return c.Class
	}
	return Class{Never, "unclassified address"}
}

// embeddedIPv4 returns the IPv4 addresses an IPv6 address embeds, and the
// name of the form. Teredo embeds two: the server, and the client
// (obfuscated by inverting its bits). For the local-use NAT64 prefix
// 64:ff9b:1::/48 the IPv4 address is read from the last 32 bits, the /96
// layout of RFC 6052.
func embeddedIPv4(a netip.Addr) (kind string, out [2]netip.Addr, n int) {
	b := a.As16()
	last := netip.AddrFrom4([4]byte(b[12:16]))
	switch {
	case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && b[4] == 0 && b[5] == 0 && zero(b[6:12]):
		return "NAT64", [2]netip.Addr{last}, 1
	case b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && b[4] == 0 && b[5] == 1:
		return "local-use NAT64", [2]netip.Addr{last}, 1
	case b[0] == 0x20 && b[1] == 0x02:
		return "6to4", [2]netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}, 1
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		server := netip.AddrFrom4([4]byte(b[4:8]))
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return "Teredo", [2]netip.Addr{server, client}, 2
	case zero(b[0:12]):
		return "IPv4-compatible", [2]netip.Addr{last}, 1
	case zero(b[0:8]) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0:
		return "IPv4-translated", [2]netip.Addr{last}, 1
	}
	return "", out, 0
}

// EmbeddedIPv4 returns the IPv4 addresses an IPv6 address embeds
// (NAT64, 6to4, Teredo, IPv4-compatible and -translated forms) and how
// many there are: where a dial to a reaches, beyond a itself.
// IPv4-mapped addresses are not among them: unmap those first.
func EmbeddedIPv4(a netip.Addr) ([2]netip.Addr, int) {
	if !a.Is6() || a.Is4In6() {
		return [2]netip.Addr{}, 0
	}
	_, out, n := embeddedIPv4(a)
	return out, n
}

func zero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
