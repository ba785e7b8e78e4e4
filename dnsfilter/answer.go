package dnsfilter

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// maxChain bounds the CNAME chain followed in an answer.
const maxChain = 16

// answer is an upstream answer made fit for one agent.
type answer struct {
	rcode   int
	records []dns.RR // answer section
	soa     []dns.RR // authority section: the SOA of a negative answer
	addrs   []resolved
	removed int    // address records removed by netguard
	why     string // the reason for the first removal or denial
	denied  bool   // a CNAME target is not allowed: the whole answer is withheld
	rule    string // the policy entry that denied a CNAME target
}

// resolved is an address the agent will see, with its record's TTL.
type resolved struct {
	addr netip.Addr
	ttl  time.Duration
}

// filterOptions are the per-agent facts filtering needs.
type filterOptions struct {
	policy       *policy.Policy
	guard        *netguard.Guard
	allowPrivate bool
	trustCNAME   bool
	// approved: the name was approved (ask mode), and so is the chain
	// it resolves through, but for a target refused outright.
	approved bool
	age      time.Duration // how long the upstream answer was cached
}

// filter keeps from an upstream answer only what the agent may see:
//
//   - the chain of CNAMEs from the question, each target judged by the
//     policy (unless trustCNAME); a denied target withholds the answer;
//   - records owned by names in that chain, and no others;
//   - A and AAAA records whose address netguard permits for this agent;
//   - SVCB and HTTPS address hints only when every hint is permitted;
//   - of the authority section, only an SOA (for negative caching);
//
// with TTLs lowered by the time the answer spent in the cache.
func filter(up *dns.Msg, q dns.Question, o filterOptions) answer {
	a := answer{rcode: up.Rcode}
	chain := []string{q.Name}
	current := q.Name
	for range maxChain {
		target := ""
		for _, rr := range up.Answer {
			if c, ok := rr.(*dns.CNAME); ok && hostname.Same(c.Hdr.Name, current) {
				target = c.Target
				break
			}
		}
		if target == "" || containsName(chain, target) {
			break
		}
		if !o.trustCNAME {
			if d := o.policy.DecideName(strings.TrimSuffix(target, ".")); !d.Allowed && !(o.approved && d.Askable) {
				a.denied, a.why, a.rule = true, "CNAME target "+strings.TrimSuffix(target, ".")+": "+d.Reason, d.Rule
				return a
			}
		}
		chain = append(chain, target)
		current = target
	}
	age := uint32(o.age / time.Second)
	for _, rr := range up.Answer {
		h := rr.Header()
		if !containsName(chain, h.Name) {
			continue
		}
		ttl := h.Ttl - min(age, h.Ttl)
		switch v := rr.(type) {
		case *dns.A:
			if !a.permit(v.A, o) {
				continue
			}
			ip, _ := netip.AddrFromSlice(v.A)
			a.addrs = append(a.addrs, resolved{ip.Unmap(), time.Duration(ttl) * time.Second})
			a.records = append(a.records, &dns.A{Hdr: withTTL(h, ttl), A: v.A})
		case *dns.AAAA:
			if !a.permit(v.AAAA, o) {
				continue
			}
			ip, _ := netip.AddrFromSlice(v.AAAA)
			a.addrs = append(a.addrs, resolved{ip, time.Duration(ttl) * time.Second})
			a.records = append(a.records, &dns.AAAA{Hdr: withTTL(h, ttl), AAAA: v.AAAA})
		case *dns.SVCB:
			if c := a.filterHints(v, o); c != nil {
				c.Hdr.Ttl = ttl
				a.records = append(a.records, c)
			}
		case *dns.HTTPS:
			if c := a.filterHints(&v.SVCB, o); c != nil {
				c.Hdr.Ttl = ttl
				a.records = append(a.records, &dns.HTTPS{SVCB: *c})
			}
		case *dns.CNAME:
			// Only the chain's own links: another CNAME of a name in
			// it would hand the agent a name nothing judged.
			if i := indexName(chain, h.Name); i >= 0 && i+1 < len(chain) && hostname.Same(chain[i+1], v.Target) {
				a.records = append(a.records, &dns.CNAME{Hdr: withTTL(h, ttl), Target: v.Target})
			}
		default:
			c := dns.Copy(rr)
			c.Header().Ttl = ttl
			a.records = append(a.records, c)
		}
	}
	for _, rr := range up.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			c := dns.Copy(soa)
			c.Header().Ttl -= min(age, c.Header().Ttl)
			a.soa = append(a.soa, c)
		}
	}
	return a
}

// permit reports whether netguard lets this agent reach ip, noting the
// first reason it does not.
func (a *answer) permit(ip []byte, o filterOptions) bool {
	addr, ok := netip.AddrFromSlice(ip)
	c := o.guard.Classify(addr)
	if ok && c.Permits(o.allowPrivate) {
		return true
	}
	a.removed++
	if a.why == "" {
		a.why = "answer " + addr.String() + " removed: " + c.String()
	}
	return false
}

// filterHints returns a copy of an SVCB record, or nil when one of its
// address hints is not permitted: a client may connect to a hint without
// asking for A or AAAA, so a hint is an answer too.
func (a *answer) filterHints(s *dns.SVCB, o filterOptions) *dns.SVCB {
	for _, kv := range s.Value {
		var ips [][]byte
		switch h := kv.(type) {
		case *dns.SVCBIPv4Hint:
			for _, ip := range h.Hint {
				ips = append(ips, ip)
			}
		case *dns.SVCBIPv6Hint:
			for _, ip := range h.Hint {
				ips = append(ips, ip)
			}
		}
		for _, ip := range ips {
			if !a.permit(ip, o) {
				return nil
			}
		}
	}
	return dns.Copy(s).(*dns.SVCB)
}

func withTTL(h *dns.RR_Header, ttl uint32) dns.RR_Header {
	c := *h
	c.Ttl = ttl
	return c
}

// containsName reports whether n (off the wire) is one of names.
func containsName(names []string, n string) bool { return indexName(names, n) >= 0 }

// indexName is the index of the first of names that is n, or -1.
func indexName(names []string, n string) int {
	return slices.IndexFunc(names, func(x string) bool { return hostname.Same(x, n) })
}
