package dnsfilter

import (
	"context"
	"net"
	"net/netip"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/policy"
)

// LookupNetIP resolves host for the gateway itself, through the same
// upstreams and cache as the sandboxes' queries but without any policy:
// it is what the gateway connects to (the "server-side resolution"), and
// netguard checks each address at dial time. A lookup made for an agent
// (policy.WithAgent) takes that agent's share of the gateway's budget. It implements
// netguard.Resolver, so tproxy and mitm can use the Server directly.
func (s *Server) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	s.init()
	var qtypes []uint16
	switch network {
	case "ip":
		qtypes = []uint16{dns.TypeA, dns.TypeAAAA}
	case "ip4":
		qtypes = []uint16{dns.TypeA}
	case "ip6":
		qtypes = []uint16{dns.TypeAAAA}
	default:
		return nil, &net.DNSError{Err: "unsupported network " + network, Name: host}
	}
	canon, err := hostname.Normalize(host)
	if err != nil {
		return nil, &net.DNSError{Err: err.Error(), Name: host, IsNotFound: true}
	}
	name := dns.Fqdn(canon)
	if agent := policy.AgentFrom(ctx); agent != "" {
		// A name the gateway resolves for an agent leaves as surely as
		// one the agent looks up itself.
		// Its verdict reaches the record of the connection or request
		// the lookup is for.
		if why := s.suspectTunnel(agent, name, dns.TypeA, false); why != "" {
			egresslog.NotesFrom(ctx).Add(why)
			if s.Tunnel.Refuse {
				return nil, &net.DNSError{Err: why, Name: host, IsNotFound: true}
			}
		}
	}
	type result struct {
		i     int
		addrs []netip.Addr
		err   error
	}
	results := make(chan result, len(qtypes))
	for i, qt := range qtypes {
		go func() {
			q := dns.Question{Name: name, Qtype: qt, Qclass: dns.ClassINET}
			m, _, err := s.resolve(ctx, asker{agent: policy.AgentFrom(ctx), gateway: true}, canon, q, false)
			if err != nil {
				results <- result{i: i, err: err}
				return
			}
			results <- result{i: i, addrs: addressesOf(m, name)}
		}()
	}
	byType := make([][]netip.Addr, len(qtypes)) // IPv4 first, in a stable order
	var firstErr error
	for range qtypes {
		select {
		case r := <-results:
			byType[r.i] = r.addrs
			if r.err != nil && firstErr == nil {
				firstErr = r.err
			}
		case <-ctx.Done():
			return nil, &net.DNSError{Err: ctx.Err().Error(), Name: host, IsTimeout: true}
		}
	}
	var addrs []netip.Addr
	for _, a := range byType {
		addrs = append(addrs, a...)
	}
	if len(addrs) == 0 {
		if firstErr != nil {
			return nil, &net.DNSError{Err: firstErr.Error(), Name: host, IsTemporary: true}
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// addressesOf returns the addresses an answer gives for name, following
// its CNAME chain.
func addressesOf(m *dns.Msg, name string) []netip.Addr {
	chain := []string{name}
	for range maxChain {
		next := ""
		for _, rr := range m.Answer {
			if c, ok := rr.(*dns.CNAME); ok && hostname.Same(c.Hdr.Name, chain[len(chain)-1]) {
				next = c.Target
			}
		}
		if next == "" || containsName(chain, next) {
			break
		}
		chain = append(chain, next)
	}
	var out []netip.Addr
	for _, rr := range m.Answer {
		if !containsName(chain, rr.Header().Name) {
			continue
		}
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			ip = v.A
		case *dns.AAAA:
			ip = v.AAAA
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap())
		}
	}
	return out
}
