package netguard

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClassifyRegistry asserts every row of the IANA IPv4 and IPv6
// special-purpose address registries, plus private use and multicast, at
// the first and last address of each block and just outside it.
func TestClassifyRegistry(t *testing.T) {
	tests := []struct {
		addr string
		want Tier
	}{
		// IPv4 special-purpose registry.
		{"0.0.0.0", Never}, {"0.255.255.255", Never}, {"1.0.0.0", Public},
		{"9.255.255.255", Public}, {"10.0.0.0", Private}, {"10.255.255.255", Private}, {"11.0.0.0", Public},
		{"100.63.255.255", Public}, {"100.64.0.0", Private}, {"100.127.255.255", Private}, {"100.128.0.0", Public},
		{"126.255.255.255", Public}, {"127.0.0.0", Never}, {"127.0.0.1", Never}, {"127.255.255.255", Never}, {"128.0.0.0", Public},
		{"169.253.255.255", Public}, {"169.254.0.0", Never}, {"169.254.255.255", Never}, {"169.255.0.0", Public},
		{"172.15.255.255", Public}, {"172.16.0.0", Private}, {"172.31.255.255", Private}, {"172.32.0.0", Public},
		{"191.255.255.255", Public}, {"192.0.0.0", Never}, {"192.0.0.7", Never}, {"192.0.0.8", Never},
		{"192.0.0.9", Public}, {"192.0.0.10", Public}, {"192.0.0.11", Never}, {"192.0.0.170", Never},
		{"192.0.0.171", Never}, {"192.0.0.255", Never}, {"192.0.1.0", Public},
		{"192.0.1.255", Public}, {"192.0.2.0", Never}, {"192.0.2.255", Never}, {"192.0.3.0", Public},
		{"192.31.195.255", Public}, {"192.31.196.0", Public}, {"192.31.196.255", Public},
		{"192.52.193.0", Public}, {"192.52.193.255", Public},
		{"192.88.98.255", Public}, {"192.88.99.0", Never}, {"192.88.99.255", Never}, {"192.88.100.0", Public},
		{"192.167.255.255", Public}, {"192.168.0.0", Private}, {"192.168.255.255", Private}, {"192.169.0.0", Public},
		{"192.175.48.0", Public}, {"192.175.48.255", Public},
		{"198.17.255.255", Public}, {"198.18.0.0", Never}, {"198.19.255.255", Never}, {"198.20.0.0", Public},
		{"198.51.99.255", Public}, {"198.51.100.0", Never}, {"198.51.100.255", Never}, {"198.51.101.0", Public},
		{"203.0.112.255", Public}, {"203.0.113.0", Never}, {"203.0.113.255", Never}, {"203.0.114.0", Public},
		{"223.255.255.255", Public}, {"224.0.0.0", Never}, {"239.255.255.255", Never},
		{"240.0.0.0", Never}, {"255.255.255.254", Never}, {"255.255.255.255", Never},
		{"8.8.8.8", Public}, {"140.82.112.3", Public},
		// Cloud metadata, including the public-looking ones.
		{"169.254.169.254", Never}, {"169.254.170.2", Never}, {"100.100.100.200", Never},
		{"100.100.100.199", Private}, {"168.63.129.16", Never}, {"168.63.129.15", Public}, {"168.63.129.17", Public},
		{"fd00:ec2::254", Never}, {"fd00:ec2::253", Private}, {"192.0.0.192", Never},

		// IPv6 special-purpose registry.
		{"::", Never}, {"::1", Never}, {"::2", Never},
		{"::ffff:127.0.0.1", Never}, {"::ffff:8.8.8.8", Public}, {"::ffff:10.0.0.1", Private},
		{"64:ff9b::808:808", Public}, {"64:ff9b::7f00:1", Never}, {"64:ff9b::a00:1", Private},
		{"64:ff9b:1::808:808", Never}, {"64:ff9b:1:ffff:ffff:ffff:ffff:ffff", Never},
		{"100::", Never}, {"100::ffff:ffff:ffff:ffff", Never}, {"100:0:0:1::", Never}, {"100:0:0:1:ffff:ffff:ffff:ffff", Never}, {"100:0:0:2::", Never},
		{"2001::", Never}, {"2001:1::", Never}, {"2001:1::1", Public}, {"2001:1::2", Public}, {"2001:1::3", Public}, {"2001:1::4", Never},
		{"2001:2::", Never}, {"2001:2:0:ffff:ffff:ffff:ffff:ffff", Never}, {"2001:2:1::", Never},
		{"2001:3::", Public}, {"2001:3:ffff:ffff:ffff:ffff:ffff:ffff", Public},
		{"2001:4:112::", Public}, {"2001:4:112:ffff:ffff:ffff:ffff:ffff", Public}, {"2001:4:113::", Never},
		{"2001:10::", Never}, {"2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", Never},
		{"2001:20::", Public}, {"2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", Public},
		{"2001:30::", Public}, {"2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", Public}, {"2001:40::", Never},
		{"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", Never}, {"2001:200::", Public},
		{"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", Public}, {"2001:db8::", Never}, {"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", Never}, {"2001:db9::", Public},
		{"2002:808:808::", Public}, {"2002:7f00:1::", Never},
		{"2620:4f:8000::", Public}, {"2620:4f:8000:ffff:ffff:ffff:ffff:ffff", Public},
		{"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Public}, {"3fff::", Never}, {"3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", Never}, {"3fff:1000::", Public},
		{"3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Public}, {"4000::", Never},
		{"5f00::", Never}, {"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Never}, {"2000::", Public},
		{"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Never}, {"fc00::", Private}, {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Private}, {"fe00::", Never},
		{"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Never}, {"fe80::", Never}, {"fe80::1%eth0", Never}, {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Never},
		{"fec0::", Never}, {"ff00::", Never}, {"ff02::1", Never}, {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Never},
		{"2606:4700::1111", Public},
	}
	var g Guard
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			c := g.Classify(netip.MustParseAddr(tt.addr))
			assert.Equal(t, tt.want, c.Tier, "Classify(%s) = %v", tt.addr, c)
			assert.NotEmpty(t, c.Reason, "Classify(%s) has no reason", tt.addr)
		})
	}
}

func TestClassifyEmbedded(t *testing.T) {
	tests := []struct {
		addr       string
		want       Tier
		reasonHint string
	}{
		{"::ffff:169.254.169.254", Never, "metadata"},
		{"64:ff9b::a9fe:a9fe", Never, "NAT64 address embedding 169.254.169.254"},
		{"64:ff9b::c0a8:1", Private, "NAT64 address embedding 192.168.0.1"},
		{"64:ff9b::8c52:7003", Public, "NAT64"},
		{"2002:a9fe:a9fe::1", Never, "6to4 address embedding 169.254.169.254"},
		{"2002:0a00:0001::", Private, "6to4 address embedding 10.0.0.1"},
		{"2002:c000:0201::", Never, "TEST-NET-1"},
		// Teredo: server 8.8.8.8, client 127.0.0.1 obfuscated as 80ff:fffe.
		{"2001:0:808:808:0:0:80ff:fffe", Never, "Teredo address embedding 127.0.0.1"},
		// Teredo: server 127.0.0.1, client 8.8.8.8 (f7f7:f7f7).
		{"2001:0:7f00:1::f7f7:f7f7", Never, "Teredo address embedding 127.0.0.1"},
		{"2001:0:808:808::f7f7:f7f7", Public, "Teredo"},
		{"::7f00:1", Never, "IPv4-compatible address embedding 127.0.0.1"},
		{"::808:808", Public, "IPv4-compatible"},
		{"::ffff:0:7f00:1", Never, "IPv4-translated address embedding 127.0.0.1"},
		{"::ffff:0:808:808", Public, "IPv4-translated"},
	}
	var g Guard
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			c := g.Classify(netip.MustParseAddr(tt.addr))
			assert.Equal(t, tt.want, c.Tier, "Classify(%s) = %v: tier", tt.addr, c)
			assert.Contains(t, c.Reason, tt.reasonHint, "Classify(%s) = %v: reason", tt.addr, c)
		})
	}
}

func TestClassifyOperatorPrefixes(t *testing.T) {
	g, err := New(Config{
		Public: []netip.Prefix{
			netip.MustParsePrefix("198.18.0.0/15"),        // a test network
			netip.MustParsePrefix("10.20.0.0/16"),         // an internal mirror
			netip.MustParsePrefix("169.254.0.0/16"),       // does not lift metadata
			netip.MustParsePrefix("203.0.113.7/32"),       // inside a never prefix below
			netip.MustParsePrefix("64:ff9b:1::/48"),       // a local NAT64
			netip.MustParsePrefix("168.63.129.16/32"),     // equal to a metadata address
			netip.MustParsePrefix("::ffff:192.0.2.0/120"), // mapped form of TEST-NET-1
		},
		Private: []netip.Prefix{
			netip.MustParsePrefix("100.100.0.0/16"),     // a cluster's service range in public-looking space
			netip.MustParsePrefix("169.254.169.0/24"),   // does not lift metadata either
			netip.MustParsePrefix("93.184.216.128/25"),  // inside a never prefix below
			netip.MustParsePrefix("2001:db8:aaaa::/48"), // an IPv6 service range
			netip.MustParsePrefix("9.9.9.0/24"),         // public by the registry: made private
		},
		Never: []netip.Prefix{
			netip.MustParsePrefix("203.0.113.0/24"),
			netip.MustParsePrefix("93.184.216.0/24"),
			netip.MustParsePrefix("198.19.0.0/16"),
		},
	})
	require.NoError(t, err)
	tests := []struct {
		addr string
		want Tier
	}{
		{"198.18.0.1", Public},
		{"198.19.0.1", Never}, // never beats public
		{"198.17.255.255", Public},
		{"10.20.0.1", Public},
		{"10.21.0.1", Private},
		{"169.254.1.1", Public},
		{"169.254.169.254", Never},
		{"169.254.170.2", Never},
		{"168.63.129.16", Never},
		{"203.0.113.7", Never},
		{"93.184.216.34", Never},
		{"93.184.217.1", Public},
		{"64:ff9b:1::808:808", Public},
		{"64:ff9b:1::7f00:1", Never},
		{"64:ff9b::c612:1", Public}, // NAT64 embedding 198.18.0.1
		{"192.0.2.1", Public},
		{"100.100.3.4", Private},
		{"9.9.9.9", Private},
		{"9.9.10.1", Public},
		{"169.254.169.254", Never},
		{"93.184.216.200", Never},
		{"2001:db8:aaaa::1", Private},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			c := g.Classify(netip.MustParseAddr(tt.addr))
			assert.Equal(t, tt.want, c.Tier, "Classify(%s) = %v", tt.addr, c)
		})
	}
	_, err = New(Config{Public: []netip.Prefix{{}}})
	assert.Error(t, err, "New accepted an invalid prefix")
	_, err = New(Config{Private: []netip.Prefix{{}}})
	assert.Error(t, err, "New accepted an invalid private prefix")
}

func TestClassifyOwnAddresses(t *testing.T) {
	g, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}})
	require.NoError(t, err)
	own := netip.MustParseAddr("198.18.0.2")
	c := g.Classify(own)
	require.Equal(t, Public, c.Tier, "before SetOwn: %v", c)
	g.SetOwn([]netip.Prefix{netip.PrefixFrom(own, 32), netip.MustParsePrefix("2001:4860::1/128")})
	for _, a := range []string{"198.18.0.2", "::ffff:198.18.0.2", "64:ff9b::c612:2", "2001:4860::1"} {
		c := g.Classify(netip.MustParseAddr(a))
		assert.Equal(t, Never, c.Tier, "Classify(%s) = %v, want never as the gateway's own address", a, c)
		assert.Contains(t, c.Reason, "own address", "Classify(%s) = %v, want never as the gateway's own address", a, c)
	}
	c = g.Classify(netip.MustParseAddr("198.18.0.3"))
	assert.Equal(t, Public, c.Tier, "neighbour of own address: %v", c)
	g.SetOwn(nil)
	c = g.Classify(own)
	assert.Equal(t, Public, c.Tier, "after SetOwn(nil): %v", c)
}

func TestClassifyInvalid(t *testing.T) {
	var g *Guard // a nil Guard classifies with the built-in table
	c := g.Classify(netip.Addr{})
	assert.Equal(t, Never, c.Tier, "invalid address: %v", c)
	c = g.Classify(netip.MustParseAddr("1.1.1.1"))
	assert.Equal(t, Public, c.Tier, "nil guard: %v", c)
}

func TestPermits(t *testing.T) {
	tests := []struct {
		tier         Tier
		allowPrivate bool
		want         bool
	}{
		{Public, false, true},
		{Private, false, false},
		{Private, true, true},
		{Never, true, false},
		{Tier(7), true, false},
	}
	for _, tt := range tests {
		got := (Class{Tier: tt.tier}).Permits(tt.allowPrivate)
		assert.Equal(t, tt.want, got, "%v.Permits(%v)", tt.tier, tt.allowPrivate)
	}
}

func BenchmarkClassify(b *testing.B) {
	var g Guard
	addrs := []netip.Addr{
		netip.MustParseAddr("140.82.112.3"),
		netip.MustParseAddr("10.1.2.3"),
		netip.MustParseAddr("169.254.169.254"),
		netip.MustParseAddr("2606:4700::1111"),
		netip.MustParseAddr("::ffff:127.0.0.1"),
		netip.MustParseAddr("fd00::1"),
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		g.Classify(addrs[i%len(addrs)])
	}
}
