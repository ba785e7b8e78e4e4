package netguard

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLiteral(t *testing.T) {
	tests := []struct {
		host string
		want string // "" with name true: a name; "" with name false: invalid
		name bool
	}{
		{"127.0.0.1", "127.0.0.1", false},
		{"2130706433", "127.0.0.1", false},
		{"0x7f000001", "127.0.0.1", false},
		{"0X7F000001", "127.0.0.1", false},
		{"017700000001", "127.0.0.1", false},
		{"127.1", "127.0.0.1", false},
		{"127.0.1", "127.0.0.1", false},
		{"0177.0.0.1", "127.0.0.1", false},
		{"0x7f.0.0.1", "127.0.0.1", false},
		{"0x7f.1", "127.0.0.1", false},
		{"127.0.0.1.", "127.0.0.1", false},
		{"169.254.43518", "169.254.169.254", false},
		{"0xa9fea9fe", "169.254.169.254", false},
		{"0", "0.0.0.0", false},
		{"[::ffff:127.0.0.1]", "::ffff:127.0.0.1", false},
		{"::ffff:127.0.0.1", "::ffff:127.0.0.1", false},
		{"[::1]", "::1", false},
		{"fe80::1%eth0", "fe80::1%eth0", false},
		{"[64:ff9b::7f00:1]", "64:ff9b::7f00:1", false},

		{"1.2.3.256", "", false},
		{"256.1.1.1", "", false},
		{"1.2.3.4.5", "", false},
		{"08.1.1.1", "", false},
		{"1..1", "", false},
		{"1.2.3.0x", "", false},
		{"4294967296", "", false},
		{"127.0.0.1..", "", true}, // an empty label; name validation refuses it
		{"1e100", "", false},
		{"foo.123", "", false},
		{"[127.0.0.1]", "", false},
		{"[::1", "", false},
		{"::g", "", false},
		{"1.1.1.1 ", "", true}, // not numeric; name validation refuses it

		{"github.com", "", true},
		{"1e100.net", "", true},
		{"0x7f000001.example", "", true},
		{"deadbeef", "", true},
		{"localhost", "", true},
		{"", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			a, err := ParseLiteral(tt.host)
			switch {
			case tt.want != "":
				assert.NoError(t, err, "ParseLiteral(%q)", tt.host)
				assert.Equal(t, netip.MustParseAddr(tt.want), a, "ParseLiteral(%q)", tt.host)
			case tt.name:
				assert.ErrorIs(t, err, ErrNotLiteral, "ParseLiteral(%q) = %v", tt.host, a)
			default:
				assert.Error(t, err, "ParseLiteral(%q) = %v; want an invalid-literal error", tt.host, a)
				assert.NotErrorIs(t, err, ErrNotLiteral, "ParseLiteral(%q) = %v; want an invalid-literal error", tt.host, a)
			}
		})
	}
}

// TestLiteralSpellingsClassify checks that every disguise of loopback and
// metadata is classified as what it is.
func TestLiteralSpellingsClassify(t *testing.T) {
	var g Guard
	for _, h := range []string{"2130706433", "0x7f000001", "017700000001", "127.1", "[::ffff:127.0.0.1]", "0177.0.0.1", "0xa9fea9fe", "169.254.43518"} {
		a, err := ParseLiteral(h)
		require.NoError(t, err, "ParseLiteral(%q)", h)
		c := g.Classify(a)
		assert.Equal(t, Never, c.Tier, "%q classified %v, want never", h, c)
	}
}

func FuzzParseLiteral(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "2130706433", "0x7f000001", "017700000001", "127.1", "[::ffff:127.0.0.1]", "0177.0.0.1", "github.com", "1.2.3.256", "fe80::1%eth0", "0x", "08"} {
		f.Add(s)
	}
	var g Guard
	f.Fuzz(func(t *testing.T, host string) {
		a, err := ParseLiteral(host)
		if err != nil {
			require.False(t, a.IsValid(), "ParseLiteral(%q) returned an address with an error", host)
			return
		}
		require.True(t, a.IsValid(), "ParseLiteral(%q) returned no address and no error", host)
		// The canonical spelling parses to the same address.
		b, err := ParseLiteral(a.String())
		require.NoError(t, err, "canonical form %q of %q", a, host)
		require.Equal(t, a, b, "canonical form %q of %q", a, host)
		c := g.Classify(a)
		require.NotEmpty(t, c.Reason, "no reason for %v", a)
	})
}

func FuzzClassify(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::7f00:1", "2001:0:808:808::80ff:fffe", "2002:a9fe:a9fe::", "fd00:ec2::254"} {
		f.Add(netip.MustParseAddr(s).AsSlice())
	}
	var g Guard
	f.Fuzz(func(t *testing.T, b []byte) {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			return
		}
		c := g.Classify(a)
		require.NotEmpty(t, c.Reason, "Classify(%v) = %v", a, c)
		require.LessOrEqual(t, c.Tier, Public, "Classify(%v) = %v", a, c)
		// Mapping an IPv4 address into IPv6 never changes its class.
		if a.Is4() {
			m := g.Classify(netip.AddrFrom16(a.As16()))
			require.Equal(t, c, m, "Classify(%v) = %v but its mapped form = %v", a, c, m)
			// NAT64 of a non-public address is never more permissive.
			b16 := a.As4()
			nat := netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: b16[0], 13: b16[1], 14: b16[2], 15: b16[3]})
			n := g.Classify(nat)
			require.LessOrEqual(t, n.Tier, c.Tier, "NAT64 %v = %v is laxer than %v = %v", nat, n, a, c)
		}
	})
}
