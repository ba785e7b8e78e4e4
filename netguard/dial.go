package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// ErrDenied matches every [DeniedError] with errors.Is.
var ErrDenied = errors.New("netguard: address denied")

// DeniedError says that an address may not be dialled, and why.
type DeniedError struct {
	Addr  netip.Addr
	Class Class
}

func (e *DeniedError) Error() string {
	why := e.Class.String()
	if e.Class.Tier == Private {
		why += "; private networks are not allowed"
	}
	return "netguard: refusing to connect to " + e.Addr.String() + ": " + why
}

// Is makes errors.Is(err, ErrDenied) true.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// Check returns a *DeniedError unless a may be dialled.
func (g *Guard) Check(a netip.Addr, allowPrivate bool) error {
	c := g.Classify(a)
	if c.Permits(allowPrivate) {
		return nil
	}
	return &DeniedError{Addr: a, Class: c}
}

// Control returns a hook for [net.Dialer.ControlContext] that refuses a
// connection unless the address the socket is about to connect to may be
// dialled. It runs after name resolution, on the address actually used, so
// a name that resolves to a denied address (DNS rebinding) is refused.
func (g *Guard) Control(allowPrivate bool) func(ctx context.Context, network, address string, c syscall.RawConn) error {
	return func(_ context.Context, _, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("netguard: refusing to connect to unparseable address %q", address)
		}
		return g.Check(ap.Addr(), allowPrivate)
	}
}

// Resolver looks up the addresses of a name; *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer dials TCP through a Guard: it resolves the name itself, drops the
// addresses the Guard (and the Check hook, if any) refuses, and connects
// to the rest with the [Guard.Control] hook installed, so the address
// checked is the address dialled. Attempts are raced as in Happy Eyeballs
// (RFC 8305): addresses of the two families alternate, each attempt starts
// FallbackDelay after the one before unless that one has already failed,
// and the first connection wins. The zero Dialer uses the built-in
// classification (or the Guard of the context, see [WithGuard]), the
// default resolver (or the context's), and refuses private networks.
type Dialer struct {
	Guard        *Guard   // nil means the context's Guard, else the built-in classification
	AllowPrivate bool     // whether private-tier addresses may be dialled
	Resolver     Resolver // nil means the context's Resolver, else net.DefaultResolver
	// Check, if set, is asked about every address the Guard permits,
	// with the host as the caller named it: a caller's policy at dial
	// time (an error refuses that address).
	Check func(ctx context.Context, host string, addr netip.AddrPort) error
	// Timeout bounds each connection attempt; zero means
	// DefaultDialTimeout.
	Timeout time.Duration
	// FallbackDelay is how long an attempt runs alone before the next
	// starts; zero means DefaultFallbackDelay, negative tries one address
	// at a time.
	FallbackDelay time.Duration
	// KeepAlive is passed to net.Dialer: zero means Go's default (15s),
	// negative disables TCP keep-alives.
	KeepAlive time.Duration
}

// Defaults for a Dialer's zero fields.
const (
	DefaultDialTimeout   = 10 * time.Second
	DefaultFallbackDelay = 250 * time.Millisecond
)

type contextKey int

const (
	guardKey contextKey = iota
	resolverKey
)

// WithGuard returns a context carrying g, which a Dialer without a Guard
// of its own uses: a proxy hands its Guard to the components it calls.
func WithGuard(ctx context.Context, g *Guard) context.Context {
	return context.WithValue(ctx, guardKey, g)
}

// WithResolver returns a context carrying r, which a Dialer without a
// Resolver of its own uses.
func WithResolver(ctx context.Context, r Resolver) context.Context {
	return context.WithValue(ctx, resolverKey, r)
}

// DialContext connects to address ("host:port"; the port must be numeric)
// over network ("tcp", "tcp4" or "tcp6").
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("netguard: dial %q: %w", address, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("netguard: dial %q: invalid port", address)
	}
	addrs, err := d.resolve(ctx, network, host)
	if err != nil {
		return nil, err
	}
	guard := d.guard(ctx)
	var permitted []netip.AddrPort
	var firstDenial error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, uint16(port))
		err := guard.Check(a, d.AllowPrivate)
		if err == nil && d.Check != nil {
			err = d.Check(ctx, host, ap)
		}
		if err != nil {
			if firstDenial == nil {
				firstDenial = err
			}
			continue
		}
		permitted = append(permitted, ap)
	}
	if len(permitted) == 0 {
		if firstDenial == nil {
			firstDenial = fmt.Errorf("netguard: %s has no address", host)
		}
		return nil, fmt.Errorf("netguard: dial %s: %w", host, firstDenial)
	}
	nd := &net.Dialer{Timeout: orDuration(d.Timeout, DefaultDialTimeout), KeepAlive: d.KeepAlive, ControlContext: guard.Control(d.AllowPrivate)}
	c, err := race(ctx, nd, network, interleave(permitted), d.FallbackDelay)
	if err != nil {
		return nil, fmt.Errorf("netguard: dial %s: %w", host, err)
	}
	return c, nil
}

func (d *Dialer) guard(ctx context.Context) *Guard {
	if d.Guard != nil {
		return d.Guard
	}
	g, _ := ctx.Value(guardKey).(*Guard)
	return g // nil: the built-in classification
}

// interleave orders addresses as Happy Eyeballs does: the first address's
// family first, then alternating families, each family in its order.
func interleave(addrs []netip.AddrPort) []netip.AddrPort {
	if len(addrs) < 2 {
		return addrs
	}
	first := addrs[0].Addr().Is4()
	var same, other []netip.AddrPort
	for _, a := range addrs {
		if a.Addr().Is4() == first {
			same = append(same, a)
		} else {
			other = append(other, a)
		}
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	for i := 0; i < len(same) || i < len(other); i++ {
		if i < len(same) {
			out = append(out, same[i])
		}
		if i < len(other) {
			out = append(out, other[i])
		}
	}
	return out
}

// race dials addrs in order, starting each after delay or as soon as the
// one before fails, and returns the first connection; the others are
// cancelled, and any that connect anyway are closed.
func race(ctx context.Context, nd *net.Dialer, network string, addrs []netip.AddrPort, delay time.Duration) (net.Conn, error) {
	if len(addrs) == 1 { // nothing to race: no goroutine, no channel
		return nd.DialContext(ctx, network, addrs[0].String())
	}
	if delay == 0 {
		delay = DefaultFallbackDelay
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   net.Conn
		err error
	}
	results := make(chan result, len(addrs))
	var errs []error
	started, pending := 0, 0
	start := func() {
		a := addrs[started]
		started++
		pending++
		go func() {
			c, err := nd.DialContext(ctx, network, a.String())
			results <- result{c, err}
		}()
	}
	start()
	var timer <-chan time.Time
	for pending > 0 {
		if started < len(addrs) && delay > 0 && timer == nil {
			timer = time.After(delay)
		}
		select {
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				go func(n int) { // close the losers that connect anyway
					for range n {
						if r := <-results; r.c != nil {
							r.c.Close()
						}
					}
				}(pending)
				return r.c, nil
			}
			errs = append(errs, r.err)
			if started < len(addrs) && ctx.Err() == nil {
				start() // a failure starts the next at once
				timer = nil
			}
		case <-timer:
			timer = nil
			if started < len(addrs) {
				start()
			}
		}
	}
	return nil, errors.Join(errs...)
}

func orDuration(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

func (d *Dialer) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	a, err := ParseLiteral(host)
	if err == nil {
		return []netip.Addr{a}, nil
	}
	if !errors.Is(err, ErrNotLiteral) {
		return nil, err
	}
	var ipNetwork string
	switch network {
	case "tcp":
		ipNetwork = "ip"
	case "tcp4":
		ipNetwork = "ip4"
	case "tcp6":
		ipNetwork = "ip6"
	default:
		return nil, fmt.Errorf("netguard: unsupported network %q", network)
	}
	var r Resolver = net.DefaultResolver
	if d.Resolver != nil {
		r = d.Resolver
	} else if cr, ok := ctx.Value(resolverKey).(Resolver); ok && cr != nil {
		r = cr
	}
	addrs, err := r.LookupNetIP(ctx, ipNetwork, host)
	if err != nil {
		return nil, fmt.Errorf("netguard: resolve %s: %w", host, err)
	}
	// net.Resolver answers IPv4 as IPv4-mapped IPv6: unmapped, each
	// address has its own family (for Happy Eyeballs) and its usual
	// spelling (in errors and records). The answer is copied: a
	// resolver may hand the same cached slice to every caller.
	out := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		out[i] = a.Unmap()
	}
	return out, nil
}

// LocalPrefixes lists the addresses of this host's interfaces, as single
// address prefixes for [Guard.SetOwn].
func LocalPrefixes() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("netguard: list interface addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
			ip = ip.Unmap()
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return out, nil
}
