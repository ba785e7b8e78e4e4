package netguard

import (
	"errors"
	"net/netip"
	"testing"
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
				if err != nil || a != netip.MustParseAddr(tt.want) {
					t.Errorf("ParseLiteral(%q) = %v, %v; want %s", tt.host, a, err, tt.want)
				}
			case tt.name:
				if !errors.Is(err, ErrNotLiteral) {
					t.Errorf("ParseLiteral(%q) = %v, %v; want ErrNotLiteral", tt.host, a, err)
				}
			default:
				if err == nil || errors.Is(err, ErrNotLiteral) {
					t.Errorf("ParseLiteral(%q) = %v, %v; want an invalid-literal error", tt.host, a, err)
				}
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
		if err != nil {
			t.Fatalf("ParseLiteral(%q): %v", h, err)
		}
		if c := g.Classify(a); c.Tier != Never {
			t.Errorf("%q classified %v, want never", h, c)
		}
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
			if a.IsValid() {
				t.Fatalf("ParseLiteral(%q) returned an address with an error", host)
			}
			return
		}
		if !a.IsValid() {
			t.Fatalf("ParseLiteral(%q) returned no address and no error", host)
		}
		// The canonical spelling parses to the same address.
		if b, err := ParseLiteral(a.String()); err != nil || b != a {
			t.Fatalf("canonical form %q of %q parses to %v, %v", a, host, b, err)
		}
		if c := g.Classify(a); c.Reason == "" {
			t.Fatalf("no reason for %v", a)
		}
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
		if c.Reason == "" || c.Tier > Public {
			t.Fatalf("Classify(%v) = %v", a, c)
		}
		// Mapping an IPv4 address into IPv6 never changes its class.
		if a.Is4() {
			if m := g.Classify(netip.AddrFrom16(a.As16())); m != c {
				t.Fatalf("Classify(%v) = %v but its mapped form = %v", a, c, m)
			}
			// NAT64 of a non-public address is never more permissive.
			b16 := a.As4()
			nat := netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: b16[0], 13: b16[1], 14: b16[2], 15: b16[3]})
			if n := g.Classify(nat); n.Tier > c.Tier {
				t.Fatalf("NAT64 %v = %v is laxer than %v = %v", nat, n, a, c)
			}
		}
	})
}
