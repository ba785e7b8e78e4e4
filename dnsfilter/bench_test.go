package dnsfilter

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/dnsfilter/internal/dnsload"
	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// serveHandler runs a miekg/dns UDP server with h on loopback.
func serveHandler(b *testing.B, h dns.Handler) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	b.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// BenchmarkThroughput measures, in the same run and with the same load,
// queries per second answered by a trivial miekg/dns responder, by a plain
// forwarder (no cache) in front of a loopback authoritative server, and by
// dnsfilter (policy, cache, answer filtering, address memory, request log)
// in front of the same server. b.N is the number of queries sent to each.
// Run with -benchtime=200000x for stable figures.
func BenchmarkThroughput(b *testing.B) {
	up := startUpstream(b)
	trivial := serveHandler(b, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(140, 82, 112, 3)}}
		w.WriteMsg(m)
	}))
	forwarder := serveHandler(b, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		c := dns.Client{Timeout: 2 * time.Second}
		resp, _, err := c.Exchange(r, up.addr)
		if err != nil {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeServerFailure)
			w.WriteMsg(m)
			return
		}
		w.WriteMsg(resp)
	}))
	// No rate quota: the benchmark asks as fast as it can.
	pol, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"a.test", "*.npmjs.org", "github.com"}, Quotas: policy.Quotas{DNSQueriesPerSecond: -1}})
	require.NoError(b, err)
	filterSrv := &Server{
		Agents:    func(netip.Addr) (string, *policy.Policy, bool) { return "bench", pol, true },
		Upstreams: []string{up.addr},
		Log:       &egresslog.Log{},
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(b, err)
	go filterSrv.Serve(pc, nil)
	b.Cleanup(func() { filterSrv.Close() })

	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	query, err := m.Pack()
	require.NoError(b, err)
	run := func(addr string) float64 {
		// Warm up (and fill the cache), then measure.
		_, err := dnsload.Run(addr, query, 2000, 16, time.Second, time.Now().Add(10*time.Second))
		require.NoError(b, err)
		res, err := dnsload.Run(addr, query, b.N, 16, time.Second, time.Now().Add(60*time.Second))
		require.NoError(b, err)
		require.LessOrEqual(b, res.Lost, res.Answered/100, "%s: %d of %d queries lost", addr, res.Lost, res.Answered+res.Lost)
		return res.QPS()
	}
	b.ResetTimer()
	qTrivial := run(trivial)
	qForwarder := run(forwarder)
	qFilter := run(pc.LocalAddr().String())
	b.StopTimer()
	b.ReportMetric(qTrivial, "trivial-qps")
	b.ReportMetric(qForwarder, "forwarder-qps")
	b.ReportMetric(qFilter, "dnsfilter-qps")
	b.ReportMetric(qFilter/qTrivial, "dnsfilter/trivial")
}
