package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// bigPolicy has 10,000 entries: 5,000 names, 2,000 wildcards and 2,000
// prefixes, with a mix of ports, and 1,000 deny entries (names, wildcards
// and prefixes).
func bigPolicy(b *testing.B) *Policy {
	var allow []string
	for i := 0; i < 5000; i++ {
		port := []string{"", ":22", ":*", ":8000-8100"}[i%4]
		allow = append(allow, fmt.Sprintf("svc%d.host%d.example%s", i, i%97, port))
	}
	for i := 0; i < 2000; i++ {
		allow = append(allow, fmt.Sprintf("*.zone%d.example", i))
	}
	for i := 0; i < 2000; i++ {
		bits := []int{24, 16, 28, 32}[i%4]
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(11 + i%50), byte(i / 50), byte(i), 0}), bits).Masked()
		allow = append(allow, fmt.Sprintf("%s:443", p))
	}
	for i := 0; i < 1000; i++ {
		switch i % 3 {
		case 0:
			allow = append(allow, fmt.Sprintf("!svc%d.denied%d.example", i, i%31))
		case 1:
			allow = append(allow, fmt.Sprintf("!*.dzone%d.example", i))
		default:
			allow = append(allow, fmt.Sprintf("!%d.%d.%d.0/24", 60+i%50, i/50, i%256))
		}
	}
	p, err := New(Config{Mode: Allowlist, Allow: allow})
	require.NoError(b, err)
	require.Equal(b, 10000, p.Len(), "policy entries")
	return p
}

func BenchmarkDecide10k(b *testing.B) {
	p := bigPolicy(b)
	cases := []struct {
		name  string
		host  string
		port  uint16
		allow bool
	}{
		{"exact", "svc4000.host23.example", 443, true},
		{"wildcard", "a.b.zone1500.example", 443, true},
		{"miss", "nothing.here.example.com", 443, false},
		{"port miss", "svc4001.host24.example", 443, false},
		{"address", "11.20.232.9", 443, true},
		{"address miss", "93.184.216.34", 443, false},
		{"deny exact", "svc3.denied3.example", 443, false},
		{"deny wildcard", "a.dzone1.example", 443, false},
		{"deny address", "62.0.2.9", 443, false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			d := p.Decide(c.host, c.port)
			require.Equal(b, c.allow, d.Allowed, "Decide(%q) = %+v", c.host, d)
			b.ReportAllocs()
			for b.Loop() {
				p.Decide(c.host, c.port)
			}
		})
	}
}

func BenchmarkDecideAddr10k(b *testing.B) {
	p := bigPolicy(b)
	a := netip.MustParseAddr("11.20.232.9")
	b.ReportAllocs()
	for b.Loop() {
		p.DecideAddr(a, 443)
	}
}

func BenchmarkCompile10k(b *testing.B) {
	for b.Loop() {
		bigPolicy(b)
	}
}
