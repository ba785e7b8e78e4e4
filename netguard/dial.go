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
// addresses the Guard refuses, and connects to one of the rest with the
// [Guard.Control] hook installed, so the address checked is the address
// dialled. The zero Dialer uses the built-in classification, the default
// resolver, and refuses private networks.
type Dialer struct {
	Guard        *Guard        // nil means the built-in classification
	AllowPrivate bool          // whether private-tier addresses may be dialled
	Resolver     Resolver      // nil means net.DefaultResolver
	Timeout      time.Duration // per connection attempt; zero means 10s
	// KeepAlive is passed to net.Dialer: zero means Go's default (15s),
	// negative disables TCP keep-alives.
	KeepAlive time.Duration
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
	var permitted []netip.Addr
	var firstDenial error
	for _, a := range addrs {
		if err := d.Guard.Check(a, d.AllowPrivate); err != nil {
			if firstDenial == nil {
				firstDenial = err
			}
			continue
		}
		permitted = append(permitted, a)
	}
	if len(permitted) == 0 {
		if firstDenial == nil {
			firstDenial = fmt.Errorf("netguard: %s has no address", host)
		}
		return nil, fmt.Errorf("netguard: dial %s: %w", host, firstDenial)
	}
	nd := net.Dialer{Timeout: d.timeout(), KeepAlive: d.KeepAlive, ControlContext: d.Guard.Control(d.AllowPrivate)}
	var errs []error
	for _, a := range permitted {
		c, err := nd.DialContext(ctx, network, netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("netguard: dial %s: %w", host, errors.Join(errs...))
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
	}
	addrs, err := r.LookupNetIP(ctx, ipNetwork, host)
	if err != nil {
		return nil, fmt.Errorf("netguard: resolve %s: %w", host, err)
	}
	return addrs, nil
}

func (d *Dialer) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return 10 * time.Second
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
