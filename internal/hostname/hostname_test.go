package hostname

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNormalize(t *testing.T) {
	tests := []struct{ in, want, err string }{
		{"github.com", "github.com", ""},
		{"GitHub.COM.", "github.com", ""},
		{"_svc._tcp.example.net", "_svc._tcp.example.net", ""},
		{"bücher.example", "xn--bcher-kva.example", ""},
		{"XN--BCHER-KVA.example", "xn--bcher-kva.example", ""},
		{"", "", "empty name"},
		{".", "", "empty name"},
		{"a..b", "", "invalid name"},
		{"-a.example", "", "invalid name"},
		{"a-.example", "", "invalid name"},
		{"a b.example", "", "invalid name"},
		{"a/b.example", "", "invalid name"},
		{strings.Repeat("a", 64) + ".example", "", "invalid name"},
		{strings.Repeat("a.", 127) + "ab", "", "invalid name"}, // 256 bytes
		{"127.0.0.1", "", "an address"},
		{"2130706433", "", "an address"},
		{"0x7f.1", "", "an address"},
		{"1.2.3.0X4", "", "an address"},
		{"evil.0x", "", "an address"},
		{"example.123", "", "an address"},
		{"123.example", "123.example", ""},
		{"0x7f.example", "0x7f.example", ""},
		{"xn--zz.example", "", "internationalised"},
		{"\xff.example", "", "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Normalize(tt.in)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { Normalize("api.github.com") }), "a canonical name allocates")
}

func TestPattern(t *testing.T) {
	exact, err := ParsePattern("API.example.com")
	require.NoError(t, err)
	wild, err := ParsePattern("*.Example.com")
	require.NoError(t, err)
	for _, tt := range []struct {
		name         string
		exact, under bool
	}{
		{"api.example.com", true, true},
		{"example.com", false, false},
		{"a.b.example.com", false, true},
		{"api.example.com.evil.net", false, false},
		{"evilexample.com", false, false},
		{".example.com", false, false},
	} {
		assert.Equal(t, tt.exact, exact.Matches(tt.name), "exact %s", tt.name)
		assert.Equal(t, tt.under, wild.Matches(tt.name), "wildcard %s", tt.name)
	}
	for _, bad := range []string{"*.com", "*.co.uk", "*", "a.*.example.com", "*example.com", "*.1.2.3.4"} {
		_, err := ParsePattern(bad)
		assert.Error(t, err, bad)
	}
	_, err = ParsePattern("*.github.io") // a private suffix: one owner per name under it
	assert.NoError(t, err)
}

func TestSuffixes(t *testing.T) {
	var got []string
	Suffixes("a.b.c.d", func(s string) bool { got = append(got, s); return true })
	assert.Equal(t, []string{"b.c.d", "c.d", "d"}, got)
	got = nil
	Suffixes("a.b.c.d", func(s string) bool { got = append(got, s); return s != "c.d" })
	assert.Equal(t, []string{"b.c.d", "c.d"}, got)
	Suffixes("single", func(string) bool { t.Fatal("a single label has no suffix"); return true })
}

// FuzzNormalize checks that a canonical name is a fixed point, valid, and
// never an address spelling.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"github.com", "Bücher.example.", "0x7f.1", "a..b", "xn--bcher-kva.example", "_x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Normalize(s)
		if err != nil {
			return
		}
		again, err := Normalize(n)
		if err != nil || again != n {
			t.Fatalf("Normalize(%q) = %q, which normalises to %q, %v", s, n, again, err)
		}
		if !canonical(n, true) || numericTLD(n) {
			t.Fatalf("Normalize(%q) = %q, not canonical", s, n)
		}
	})
}

func TestSame(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"example.com", "EXAMPLE.com.", true},
		{"a.example.com.", "a.example.com", true},
		{"example.com", "example.org", false},
		{"example.com", "xample.com", false},
	} {
		assert.Equal(t, tc.same, Same(tc.a, tc.b), "%q, %q", tc.a, tc.b)
	}
}
