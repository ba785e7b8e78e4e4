package netguard

import (
	"context"
	"net/netip"
	"slices"
	"time"
)

// followEvery is how often [Guard.FollowLocal] lists the host's addresses
// again where the kernel's announcements of changes cannot be followed.
const followEvery = 5 * time.Second

// FollowLocal sets the Guard's own addresses to this host's (those of the
// calling process's network namespace, as [LocalPrefixes] lists them) and
// keeps them so until ctx ends: an address the host gains later (an
// operator's ip addr add, a DHCP lease, a new interface) is never dialled
// either. On Linux it follows the kernel's announcements of address
// changes, so the set is current as soon as the announcement is read;
// elsewhere, or where they cannot be subscribed to, it lists the
// addresses again every few seconds. It returns once the first set is in
// place, or an error if the addresses cannot be listed.
//
// Call it in a process whose network namespace is the gateway's: a
// goroutine that entered another namespace on a locked thread is not
// followed there.
func (g *Guard) FollowLocal(ctx context.Context) error {
	f := &follower{g: g}
	run, err := f.start()
	if err != nil {
		return err
	}
	go run(ctx)
	return nil
}

// follower keeps a Guard's own addresses.
type follower struct {
	g    *Guard
	last []netip.Addr // what the Guard was last given, sorted
}

// poll lists the host's addresses every followEvery until ctx ends. A
// listing that fails keeps the last set: the addresses known to be the
// host's stay refused.
func (f *follower) poll(ctx context.Context) {
	tick := time.NewTicker(followEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			f.list()
		}
	}
}

// list sets the Guard's own addresses from a listing of the host's.
func (f *follower) list() error {
	own, err := LocalPrefixes()
	if err != nil {
		return err
	}
	addrs := make([]netip.Addr, len(own))
	for i, p := range own {
		addrs[i] = p.Addr()
	}
	f.set(addrs)
	return nil
}

// set gives the Guard these addresses as its own, but for those it never
// dials anyway (loopback, link-local, the operator's never prefixes such
// as agents' address pools), so that a gateway whose agents come and go
// with addresses of their own does not build its set again for each. A
// set equal to the last is not stored again.
func (f *follower) set(addrs []netip.Addr) {
	var own []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); f.counts(a) {
			own = append(own, a)
		}
	}
	slices.SortFunc(own, netip.Addr.Compare)
	own = slices.Compact(own)
	if f.last != nil && slices.Equal(own, f.last) {
		return
	}
	f.last = own
	prefixes := make([]netip.Prefix, len(own))
	for i, a := range own {
		prefixes[i] = netip.PrefixFrom(a, a.BitLen())
	}
	f.g.SetOwn(prefixes)
}

// counts reports whether a belongs in the Guard's own set: not if the
// Guard never dials it anyway.
func (f *follower) counts(a netip.Addr) bool {
	c, ok := f.g.lookupTable().Lookup(a)
	return !ok || c.Tier != Never
}
