package netguard

import (
	"net/netip"

	"github.com/agenthold/egress/internal/prefixmap"
)

// block is one row of the built-in classification: a prefix, its tier, and
// what it is.
type block struct {
	prefix string
	tier   Tier
	what   string
}

// registry is the built-in classification: the IANA IPv4 and IPv6
// special-purpose address registries (every row, with the tier their
// "globally reachable" column implies), the private-use blocks, multicast,
// and, for IPv6, everything outside global unicast 2000::/3. Rows for
// prefixes that embed an IPv4 address are public here; [Guard.Classify]
// then judges them by the address they embed.
var registry = []block{
	{"0.0.0.0/0", Public, "globally reachable IPv4"},
	{"0.0.0.0/8", Never, `"this network" (RFC 791)`},
	{"0.0.0.0/32", Never, `unspecified "this host" (RFC 1122)`},
	{"10.0.0.0/8", Private, "private network (RFC 1918)"},
	{"100.64.0.0/10", Private, "shared address space, CGNAT (RFC 6598)"},
	{"127.0.0.0/8", Never, "loopback (RFC 1122)"},
	{"169.254.0.0/16", Never, "link-local (RFC 3927)"},
	{"172.16.0.0/12", Private, "private network (RFC 1918)"},
	{"192.0.0.0/24", Never, "IETF protocol assignments (RFC 6890)"},
	{"192.0.0.0/29", Never, "DS-Lite (RFC 7335)"},
	{"192.0.0.8/32", Never, "IPv4 dummy address (RFC 7600)"},
	{"192.0.0.9/32", Public, "PCP anycast (RFC 7723)"},
	{"192.0.0.10/32", Public, "TURN anycast (RFC 8155)"},
	{"192.0.0.170/32", Never, "NAT64/DNS64 discovery (RFC 8880)"},
	{"192.0.0.171/32", Never, "NAT64/DNS64 discovery (RFC 8880)"},
	{"192.0.2.0/24", Never, "documentation TEST-NET-1 (RFC 5737)"},
	{"192.31.196.0/24", Public, "AS112-v4 (RFC 7535)"},
	{"192.52.193.0/24", Public, "AMT (RFC 7450)"},
	{"192.88.99.0/24", Never, "deprecated 6to4 relay anycast (RFC 7526)"},
	{"192.168.0.0/16", Private, "private network (RFC 1918)"},
	{"192.175.48.0/24", Public, "AS112 direct delegation (RFC 7534)"},
	{"198.18.0.0/15", Never, "benchmarking (RFC 2544)"},
	{"198.51.100.0/24", Never, "documentation TEST-NET-2 (RFC 5737)"},
	{"203.0.113.0/24", Never, "documentation TEST-NET-3 (RFC 5737)"},
	{"224.0.0.0/4", Never, "multicast (RFC 5771)"},
	{"240.0.0.0/4", Never, "reserved (RFC 1112)"},
	{"255.255.255.255/32", Never, "limited broadcast (RFC 919)"},

	{"::/0", Never, "outside IPv6 global unicast 2000::/3 (RFC 4291)"},
	{"::/96", Public, "IPv4-compatible (RFC 4291)"},
	{"::/128", Never, "unspecified (RFC 4291)"},
	{"::1/128", Never, "loopback (RFC 4291)"},
	{"::ffff:0:0:0/96", Public, "IPv4-translated (RFC 2765)"},
	{"64:ff9b::/96", Public, "NAT64 well-known prefix (RFC 6052)"},
	{"64:ff9b:1::/48", Never, "local-use NAT64 (RFC 8215)"},
	{"100::/64", Never, "discard-only (RFC 6666)"},
	{"100:0:0:1::/64", Never, "dummy IPv6 prefix (RFC 9780)"},
	{"2000::/3", Public, "globally reachable IPv6"},
	{"2001::/23", Never, "IETF protocol assignments (RFC 2928)"},
	{"2001::/32", Public, "Teredo (RFC 4380)"},
	{"2001:1::1/128", Public, "PCP anycast (RFC 7723)"},
	{"2001:1::2/128", Public, "TURN anycast (RFC 8155)"},
	{"2001:1::3/128", Public, "DNS-SD SRP anycast (RFC 9665)"},
	{"2001:2::/48", Never, "benchmarking (RFC 5180)"},
	{"2001:3::/32", Public, "AMT (RFC 7450)"},
	{"2001:4:112::/48", Public, "AS112-v6 (RFC 7535)"},
	{"2001:10::/28", Never, "deprecated ORCHID (RFC 4843)"},
	{"2001:20::/28", Public, "ORCHIDv2 (RFC 7343)"},
	{"2001:30::/28", Public, "drone remote ID (RFC 9374)"},
	{"2001:db8::/32", Never, "documentation (RFC 3849)"},
	{"2002::/16", Public, "6to4 (RFC 3056)"},
	{"2620:4f:8000::/48", Public, "AS112 direct delegation (RFC 7534)"},
	{"3fff::/20", Never, "documentation (RFC 9637)"},
	{"5f00::/16", Never, "SRv6 SIDs (RFC 9602)"},
	{"fc00::/7", Private, "unique local address (RFC 4193)"},
	{"fe80::/10", Never, "link-local (RFC 4291)"},
	{"fec0::/10", Never, "deprecated site-local (RFC 3879)"},
	{"ff00::/8", Never, "multicast (RFC 4291)"},
}

// metadata lists cloud metadata and host-agent endpoints. They are never
// dialled, and an operator's public prefix does not lift them: several look
// public, and one of them is the credential store of the machine.
var metadata = []block{
	{"169.254.169.254/32", Never, "cloud metadata service"},
	{"169.254.170.2/32", Never, "AWS ECS task metadata"},
	{"fd00:ec2::254/128", Never, "AWS instance metadata over IPv6"},
	{"100.100.100.200/32", Never, "Alibaba Cloud metadata service"},
	{"168.63.129.16/32", Never, "Azure WireServer"},
	{"192.0.0.192/32", Never, "Oracle Cloud metadata service"},
}

// builtinEntries turns the tables above into map entries.
func builtinEntries() []prefixmap.Entry[class] {
	var out []prefixmap.Entry[class]
	add := func(rows []block, hard bool) {
		for _, r := range rows {
			p := netip.MustParsePrefix(r.prefix)
			out = append(out, prefixmap.Entry[class]{Prefix: p, Value: class{Class{r.tier, r.what + ", " + r.prefix}, hard}})
		}
	}
	add(registry, false)
	add(metadata, true)
	return out
}
