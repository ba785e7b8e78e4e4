package netguard

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
)

// listen starts a TCP listener on loopback that accepts and closes.
func listen(t testing.TB, network, addr string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func TestControlRefusesAtConnect(t *testing.T) {
	ap := listen(t, "tcp4", "127.0.0.1:0")
	var g Guard
	d := net.Dialer{ControlContext: g.Control(true)}
	_, err := d.DialContext(context.Background(), "tcp", ap.String())
	var de *DeniedError
	require.ErrorAs(t, err, &de, "dial loopback through the hook: want a DeniedError")
	require.ErrorIs(t, err, ErrDenied, "dial loopback through the hook: want a DeniedError")
	assert.Equal(t, ap.Addr(), de.Addr, "error does not say which address: %v", err)
	assert.Equal(t, Never, de.Class.Tier, "error does not say which tier: %v", err)
	assert.Contains(t, err.Error(), "loopback", "error does not say why")

	open, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	d = net.Dialer{ControlContext: open.Control(false)}
	c, err := d.DialContext(context.Background(), "tcp", ap.String())
	require.NoError(t, err, "dial a declared-public loopback")
	c.Close()
}

func TestDialerRebinding(t *testing.T) {
	port := listen(t, "tcp4", "127.0.0.1:0").Port()
	tests := []struct {
		name    string
		d       Dialer
		host    string
		wantErr string
	}{
		{"name resolving to loopback", Dialer{Resolver: testkit.Resolver{"rebind.example": {netip.MustParseAddr("127.0.0.1")}}}, "rebind.example", "loopback"},
		{"name resolving to metadata", Dialer{Resolver: testkit.Resolver{"rebind.example": {netip.MustParseAddr("169.254.169.254")}}}, "rebind.example", "metadata"},
		{"decimal literal", Dialer{}, "2130706433", "loopback"},
		{"hex literal", Dialer{}, "0x7f000001", "loopback"},
		{"short literal", Dialer{}, "127.1", "loopback"},
		{"mapped literal", Dialer{}, "[::ffff:127.0.0.1]", "loopback"},
		{"bad literal", Dialer{}, "1.2.3.256", "not a valid"},
		{"private without opt-in", Dialer{Resolver: testkit.Resolver{"internal.example": {netip.MustParseAddr("10.0.0.1")}}}, "internal.example", "private networks are not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.host + ":" + strconv.Itoa(int(port))
			c, err := tt.d.DialContext(context.Background(), "tcp", addr)
			if err == nil {
				c.Close()
			}
			require.Error(t, err, "dial %s succeeded, want an error containing %q", addr, tt.wantErr)
			assert.Contains(t, err.Error(), tt.wantErr, "dial %s", addr)
		})
	}
}

// TestDialerSkipsDenied dials a name with a denied and a permitted
// address: the denied one is never tried, the permitted one connects.
func TestDialerSkipsDenied(t *testing.T) {
	ap := listen(t, "tcp4", "127.0.0.2:0")
	g, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	require.NoError(t, err)
	d := Dialer{Guard: g, Resolver: testkit.Resolver{"mixed.example": {netip.MustParseAddr("127.0.0.1"), ap.Addr()}}}
	c, err := d.DialContext(context.Background(), "tcp", "mixed.example:"+strconv.Itoa(int(ap.Port())))
	require.NoError(t, err, "dial")
	defer c.Close()
	assert.Equal(t, ap, c.RemoteAddr().(*net.TCPAddr).AddrPort(), "connected to the wrong address")
}

func TestDialerBadInput(t *testing.T) {
	var d Dialer
	for _, addr := range []string{"example.com", "example.com:http", "example.com:0", "example.com:70000"} {
		_, err := d.DialContext(context.Background(), "tcp", addr)
		assert.Error(t, err, "DialContext(%q) succeeded", addr)
	}
	_, err := d.DialContext(context.Background(), "udp", "example.com:53")
	assert.Error(t, err, "DialContext over udp succeeded")
}

func TestLocalPrefixes(t *testing.T) {
	ps, err := LocalPrefixes()
	require.NoError(t, err)
	found := false
	for _, p := range ps {
		if p.Addr() == netip.MustParseAddr("127.0.0.1") && p.Bits() == 32 {
			found = true
		}
	}
	assert.True(t, found, "LocalPrefixes() = %v, want 127.0.0.1/32 among them", ps)
}

// TestDialerUnmapsAnswers resolves a name whose answers come IPv4-mapped
// (as net.Resolver gives them): the check sees, and errors name, the
// IPv4 address, so Happy Eyeballs tells the families apart.
func TestDialerUnmapsAnswers(t *testing.T) {
	ap := listen(t, "tcp4", "127.0.0.2:0")
	g, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	require.NoError(t, err)
	var seen []netip.AddrPort
	d := Dialer{
		Guard:    g,
		Resolver: testkit.Resolver{"mapped.example": {netip.MustParseAddr("::ffff:127.0.0.1"), netip.AddrFrom16(ap.Addr().As16())}},
		Check: func(_ context.Context, _ string, a netip.AddrPort) error {
			seen = append(seen, a)
			return nil
		},
	}
	c, err := d.DialContext(context.Background(), "tcp", "mapped.example:"+strconv.Itoa(int(ap.Port())))
	require.NoError(t, err, "dial")
	c.Close()
	require.Len(t, seen, 1, "the check saw the permitted address only")
	assert.True(t, seen[0].Addr().Is4(), "the check saw %v, want it unmapped", seen[0])

	d.Resolver = testkit.Resolver{"mapped.example": {netip.MustParseAddr("::ffff:127.0.0.1")}}
	_, err = d.DialContext(context.Background(), "tcp", "mapped.example:80")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "to 127.0.0.1:", "the error names the mapped form: %v", err)
	assert.NotContains(t, err.Error(), "::ffff:")
}

// BenchmarkDial connects to a loopback address through a Dialer and, in
// the same run, through a bare net.Dialer, which checks nothing: what the
// guard, the check and the resolution cost per connection.
// go test -run X -bench Dial -benchmem ./netguard
func BenchmarkDial(b *testing.B) {
	ap := listen(b, "tcp4", "127.0.0.1:0")
	g, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(b, err)
	name := testkit.Resolver{"bench.example": {ap.Addr()}}
	guarded := Dialer{Guard: g, Resolver: name, Check: func(context.Context, string, netip.AddrPort) error { return nil }}
	for _, way := range []struct {
		name    string
		address string
		dial    func(ctx context.Context, network, address string) (net.Conn, error)
	}{
		{"bare", ap.String(), (&net.Dialer{}).DialContext},
		{"guarded-address", ap.String(), guarded.DialContext},
		{"guarded-name", "bench.example:" + strconv.Itoa(int(ap.Port())), guarded.DialContext},
	} {
		b.Run(way.name, func(b *testing.B) {
			for range b.N {
				c, err := way.dial(context.Background(), "tcp", way.address)
				require.NoError(b, err)
				c.Close()
			}
		})
	}
}
