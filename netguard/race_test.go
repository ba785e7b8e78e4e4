//go:build linux

package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/internal/testkit"
)

// blackHole returns 127.0.0.3:port, where the kernel drops SYNs: a
// listening socket that never accepts, with its queue full. A connection
// attempt to it hangs until its timeout, like one to a dead host.
func blackHole(t *testing.T, port uint16) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 3}, Port: int(port)}))
	require.NoError(t, unix.Listen(fd, 0))
	ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 3}), port)
	// Fill the accept queue; from then on SYNs are dropped.
	for range 4 {
		c, err := net.DialTimeout("tcp", ap.String(), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	c, err := net.DialTimeout("tcp", ap.String(), 200*time.Millisecond)
	if err == nil {
		c.Close()
		t.Skip("the kernel did not drop SYNs to a full accept queue")
	}
	return ap
}

func loopbackGuard(t *testing.T) *Guard {
	g, err := New(Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	return g
}

// TestDialerRacesPastADeadAddress: with a dead address first, the dial
// reaches the live one after the fallback delay, not after the dead one's
// timeout.
func TestDialerRacesPastADeadAddress(t *testing.T) {
	live := listen(t, "tcp4", "127.0.0.1:0")
	dead := blackHole(t, live.Port())
	d := &Dialer{
		Guard:         loopbackGuard(t),
		Resolver:      testkit.Resolver{"svc.example": {dead.Addr(), live.Addr()}},
		Timeout:       10 * time.Second,
		FallbackDelay: 50 * time.Millisecond,
	}
	start := time.Now()
	c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("svc.example", strconv.Itoa(int(live.Port()))))
	require.NoError(t, err)
	c.Close()
	assert.Less(t, time.Since(start), 2*time.Second, "the dial waited for the dead address")

	// One at a time, the same dial waits for the dead one's timeout.
	d.FallbackDelay, d.Timeout = -1, 300*time.Millisecond
	d.Resolver = testkit.Resolver{"svc.example": {dead.Addr()}}
	start = time.Now()
	_, err = d.DialContext(context.Background(), "tcp", net.JoinHostPort("svc.example", strconv.Itoa(int(dead.Port()))))
	require.Error(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "a dead address failed before its timeout")
}

func TestDialerCheckHook(t *testing.T) {
	live := listen(t, "tcp4", "127.0.0.1:0")
	var asked []string
	d := &Dialer{
		Guard:    loopbackGuard(t),
		Resolver: testkit.Resolver{"ok.example": {live.Addr()}, "no.example": {live.Addr()}},
		Check: func(_ context.Context, host string, addr netip.AddrPort) error {
			asked = append(asked, host+" "+addr.String())
			if host == "no.example" {
				return errors.New("not in the caller's policy")
			}
			return nil
		},
	}
	c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("ok.example", strconv.Itoa(int(live.Port()))))
	require.NoError(t, err)
	c.Close()
	_, err = d.DialContext(context.Background(), "tcp", net.JoinHostPort("no.example", strconv.Itoa(int(live.Port()))))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not in the caller's policy")
	assert.Equal(t, []string{"ok.example " + live.String(), "no.example " + live.String()}, asked)

	// The hook never sees what the guard refuses.
	asked = nil
	d.Guard = nil
	_, err = d.DialContext(context.Background(), "tcp", net.JoinHostPort("ok.example", strconv.Itoa(int(live.Port()))))
	assert.ErrorIs(t, err, ErrDenied)
	assert.Empty(t, asked)
}

// TestDialerTakesGuardAndResolverFromContext lets a proxy hand its Guard
// and Resolver to a component whose Dialer has none.
func TestDialerTakesGuardAndResolverFromContext(t *testing.T) {
	live := listen(t, "tcp4", "127.0.0.1:0")
	var d Dialer
	addr := net.JoinHostPort("svc.example", strconv.Itoa(int(live.Port())))
	_, err := d.DialContext(context.Background(), "tcp", addr)
	require.Error(t, err, "svc.example must not resolve without the context's resolver")
	ctx := WithResolver(WithGuard(context.Background(), loopbackGuard(t)), testkit.Resolver{"svc.example": {live.Addr()}})
	c, err := d.DialContext(ctx, "tcp", addr)
	require.NoError(t, err)
	c.Close()
	// The Dialer's own Guard wins over the context's.
	d.Guard = &Guard{}
	_, err = d.DialContext(ctx, "tcp", addr)
	assert.ErrorIs(t, err, ErrDenied)
}

func TestInterleave(t *testing.T) {
	ap := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	in := []netip.AddrPort{ap("[2001:db8::1]:1"), ap("[2001:db8::2]:1"), ap("192.0.2.1:1"), ap("[2001:db8::3]:1"), ap("192.0.2.2:1")}
	want := []netip.AddrPort{ap("[2001:db8::1]:1"), ap("192.0.2.1:1"), ap("[2001:db8::2]:1"), ap("192.0.2.2:1"), ap("[2001:db8::3]:1")}
	assert.Equal(t, want, interleave(in))
}
