package dnsfilter

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
)

// zone is the authoritative test zone the upstream serves. Addresses are
// data only: no test sends traffic to them.
var zone = map[string][]string{
	"a.test.":          {"a.test. 60 IN A 140.82.112.3", "a.test. 60 IN AAAA 2606:50c0:8000::153"},
	"private.test.":    {"private.test. 60 IN A 10.0.0.5"},
	"meta.test.":       {"meta.test. 60 IN A 169.254.169.254"},
	"mixed.test.":      {"mixed.test. 60 IN A 140.82.112.4", "mixed.test. 60 IN A 127.0.0.1"},
	"cname.test.":      {"cname.test. 60 IN CNAME a.test.", "a.test. 60 IN A 140.82.112.3"},
	"cdn.test.":        {"cdn.test. 60 IN CNAME edge.cdn.example.", "edge.cdn.example. 60 IN A 140.82.112.9"},
	"loop.test.":       {"loop.test. 60 IN CNAME loop2.test.", "loop2.test. 60 IN CNAME loop.test."},
	"twocname.test.":   {"twocname.test. 60 IN CNAME a.test.", "twocname.test. 60 IN CNAME internal.corp.", "a.test. 60 IN A 140.82.112.3", "internal.corp. 60 IN A 140.82.112.66"},
	"stray.test.":      {"stray.test. 60 IN A 140.82.112.5", "other.example. 60 IN A 140.82.112.6"},
	"txt.test.":        {`txt.test. 60 IN TXT "hello"`},
	"zero.test.":       {"zero.test. 0 IN A 140.82.112.7"},
	"svcb.test.":       {`svcb.test. 60 IN HTTPS 1 . alpn="h2" ipv4hint="127.0.0.1"`},
	"svcbok.test.":     {`svcbok.test. 60 IN HTTPS 1 . alpn="h2" ipv4hint="140.82.112.8"`},
	"tenth.example.":   {"tenth.example. 60 IN A 140.82.112.10"},
	"exfil.evil.test.": {`exfil.evil.test. 60 IN TXT "never asked"`},
}

// upstream is a real DNS server on loopback, authoritative for zone, that
// counts the queries it receives by name and can misbehave on demand.
type upstream struct {
	addr string

	mu      sync.Mutex
	queries map[string]int
	lastOpt *dns.OPT
	last    dns.MsgHdr    // the last query's header
	delay   time.Duration // before each answer
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{queries: map[string]int{}}
	pc, ln := testkit.ListenDNS(t)
	u.addr = pc.LocalAddr().String()
	testkit.ServeDNS(t, u, pc, ln)
	return u
}

func (u *upstream) count(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.queries[strings.ToLower(dns.Fqdn(name))]
}

func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.queries {
		n += c
	}
	return n
}

func (u *upstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	u.mu.Lock()
	u.queries[name]++
	u.lastOpt = r.IsEdns0()
	u.last = r.MsgHdr
	delay := u.delay
	u.mu.Unlock()
	time.Sleep(delay)

	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	switch {
	case !r.RecursionDesired:
		// As a resolver with nothing cached answers a question it is
		// not to recurse for: no data.
		m.Authoritative = false
		m.Ns = []dns.RR{mustRR("test. 60 IN SOA ns.test. admin.test. 1 3600 600 86400 30")}
	case name == "slow.test.":
		time.Sleep(2 * time.Second) // a slow server, beyond the filter's timeout
	case name == "wrongq.test.":
		m.Question[0].Name = "other.test."
	case strings.HasSuffix(name, ".ttl0.test."):
		// Names whose answers say not to cache them: a tunnel's name
		// server, counting the lookups it sees.
		m.Answer = append(m.Answer, mustRR(name+" 0 IN A 140.82.112.7"))
	case name == "big.test.":
		for i := 0; i < 60; i++ {
			m.Answer = append(m.Answer, mustRR(fmt.Sprintf("big.test. 60 IN A 140.82.113.%d", i)))
		}
	default:
		rrs, ok := zone[name]
		if !ok {
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{mustRR("test. 60 IN SOA ns.test. admin.test. 1 3600 600 86400 30")}
		}
		for _, s := range rrs {
			rr := mustRR(s)
			if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == dns.TypeCNAME || q.Qtype == dns.TypeANY {
				m.Answer = append(m.Answer, rr)
			}
		}
	}
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = int(opt.UDPSize())
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// deadUpstream returns an address where nothing answers: a UDP socket that
// reads and never replies, so queries time out.
func deadUpstream(t testing.TB) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return pc.LocalAddr().String()
}
