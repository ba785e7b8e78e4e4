package dnsfilter

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
)

// harness runs a Server on loopback in front of a real upstream. Queries
// from 127.0.0.1 belong to agent "a1" with the current policy; other
// sources are unknown.
type harness struct {
	t    *testing.T
	up   *upstream
	srv  *Server
	log  *egresslog.Log
	addr string
	pol  atomic.Pointer[policy.Policy]
}

func newHarness(t *testing.T, allow []string, configure func(*Server)) *harness {
	t.Helper()
	h := &harness{t: t, up: startUpstream(t), log: &egresslog.Log{}}
	h.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: allow})
	h.srv = &Server{
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) {
			if src == netip.MustParseAddr("127.0.0.1") {
				return "a1", h.pol.Load(), true
			}
			return "", nil, false
		},
		Upstreams: []string{h.up.addr},
		Log:       h.log,
		Timeout:   300 * time.Millisecond,
	}
	if configure != nil {
		configure(h.srv)
	}
	pc, ln := testkit.ListenDNS(t)
	h.addr = pc.LocalAddr().String()
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(pc, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h.srv.Shutdown(ctx)
		assert.ErrorIs(t, <-done, ErrServerClosed, "Serve's result")
	})
	return h
}

func (h *harness) setPolicy(cfg policy.Config) {
	p, err := policy.New(cfg)
	require.NoError(h.t, err)
	h.pol.Store(p)
}

// query asks the server over network ("udp" or "tcp") from source
// (an IP on loopback), with EDNS0 when edns is set. It retries once on
// timeout, since a server that has just started may not yet read.
func (h *harness) query(network, source, name string, qtype uint16, edns bool) *dns.Msg {
	h.t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if edns {
		m.SetEdns0(4096, true)
	}
	var local net.Addr = &net.UDPAddr{IP: net.ParseIP(source)}
	if network == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	c := dns.Client{Net: network, Timeout: 3 * time.Second, Dialer: &net.Dialer{LocalAddr: local}}
	resp, _, err := c.Exchange(m, h.addr)
	require.NoError(h.t, err, "query %s %s over %s", name, dns.TypeToString[qtype], network)
	return resp
}

func (h *harness) lastRecord() egresslog.Record {
	h.t.Helper()
	rs := h.log.List(egresslog.Filter{}, 1)
	require.Len(h.t, rs, 1, "no record")
	return rs[0]
}

func answerStrings(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		case *dns.CNAME:
			out = append(out, "CNAME "+v.Target)
		default:
			out = append(out, dns.TypeToString[rr.Header().Rrtype])
		}
	}
	return out
}

func ede(m *dns.Msg) *dns.EDNS0_EDE {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e
			}
		}
	}
	return nil
}

func TestAllowedNameIsForwardedAndRemembered(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	for _, network := range []string{"udp", "tcp"} {
		resp := h.query(network, "127.0.0.1", "A.Test", dns.TypeA, false)
		assert.Equal(t, dns.RcodeSuccess, resp.Rcode, "%s: rcode", network)
		assert.Equal(t, "140.82.112.3", strings.Join(answerStrings(resp), " "), "%s: answers", network)
	}
	resp := h.query("udp", "127.0.0.1", "a.test", dns.TypeAAAA, true)
	assert.Equal(t, "2606:50c0:8000::153", strings.Join(answerStrings(resp), " "), "AAAA answers")
	assert.Equal(t, []string{"a.test"}, h.srv.Names("a1", netip.MustParseAddr("140.82.112.3")), "Names(140.82.112.3): the canonical name")
	assert.Len(t, h.srv.Names("a1", netip.MustParseAddr("2606:50c0:8000::153")), 1, "Names(AAAA)")
	assert.Empty(t, h.srv.Names("other", netip.MustParseAddr("140.82.112.3")), "another agent sees a1's names")
	r := h.lastRecord()
	assert.Equal(t, "a1", r.Agent, "record Agent")
	assert.Equal(t, egresslog.KindDNS, r.Kind, "record Kind")
	assert.Equal(t, "AAAA", r.Method, "record Method")
	assert.True(t, r.Allowed, "record = %+v: not allowed", r)
	assert.Equal(t, 1, r.Answers, "record Answers")
	assert.Equal(t, "a.test", r.Rule, "record Rule")
}

// TestDeniedNamesNeverLeave proves that denied names, however they are
// dressed, produce no upstream query.
func TestDeniedNamesNeverLeave(t *testing.T) {
	h := newHarness(t, []string{"a.test", "*.allowed.test"}, nil)
	denied := []struct {
		name  string
		qtype uint16
	}{
		{"exfil.evil.test", dns.TypeTXT},
		{"c2VjcmV0LWRhdGEtZ29lcy1oZXJl.0123456789abcdef0123456789abcdef.evil.test", dns.TypeA},
		{strings.Repeat("x", 63) + "." + strings.Repeat("y", 63) + ".evil.test", dns.TypeAAAA},
		{"allowed.test", dns.TypeA}, // the apex of a wildcard
		{"a.test.evil.test", dns.TypeA},
		{"exfil.evil.test", dns.TypeANY},
	}
	for _, d := range denied {
		for _, network := range []string{"udp", "tcp"} {
			resp := h.query(network, "127.0.0.1", d.name, d.qtype, true)
			assert.Equal(t, dns.RcodeNameError, resp.Rcode, "%s over %s: rcode, want NXDOMAIN", d.name, network)
			assert.Empty(t, resp.Answer, "%s over %s: answers", d.name, network)
			if e := ede(resp); assert.NotNil(t, e, "%s: no EDE Blocked in %v", d.name, resp.IsEdns0()) {
				assert.Equal(t, dns.ExtendedErrorCodeBlocked, e.InfoCode, "%s: EDE info code", d.name)
			}
			r := h.lastRecord()
			assert.False(t, r.Allowed, "%s: record %+v allowed", d.name, r)
			assert.Equal(t, policy.ReasonNoRule, r.Reason, "%s: record Reason", d.name)
			assert.Equal(t, dns.RcodeNameError, r.Status, "%s: record Status", d.name)
		}
	}
	assert.Zero(t, h.up.total(), "denied names caused upstream queries: %v", h.up.queries)
}

func TestDenyAllStillAnswers(t *testing.T) {
	h := newHarness(t, nil, nil)
	h.pol.Store(policy.Deny(policy.ReasonNotEnforced))
	resp := h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false)
	assert.Equal(t, dns.RcodeNameError, resp.Rcode, "rcode, want NXDOMAIN")
	assert.Equal(t, policy.ReasonNotEnforced, h.lastRecord().Reason, "record Reason")
	assert.Zero(t, h.up.total(), "deny-all forwarded a query")
}

// TestUnknownSourceDropped sends queries from a source no agent owns:
// they are never answered, forwarded or recorded, only counted, so that
// spoofed sources can neither fill the log nor aim answers anywhere.
func TestUnknownSourceDropped(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	for _, network := range []string{"udp", "tcp"} {
		m := new(dns.Msg)
		m.SetQuestion("a.test.", dns.TypeA)
		local := net.Addr(&net.UDPAddr{IP: net.ParseIP("127.0.0.2")})
		if network == "tcp" {
			local = &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
		}
		c := dns.Client{Net: network, Timeout: 300 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: local}}
		resp, _, err := c.Exchange(m, h.addr)
		assert.Error(t, err, "%s: an unknown source got an answer: %v", network, resp)
	}
	assert.Zero(t, h.up.total(), "an unknown source's query was forwarded")
	assert.Empty(t, h.log.List(egresslog.Filter{}, 0), "an unknown source's queries were recorded")
	assert.EqualValues(t, 2, h.srv.Counters().UnknownSources, "unknown sources counted")
	// The zero Server knows no agent and answers nothing.
	var zero Server
	w := &testWriter{remote: &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5353}}
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	zero.ServeDNS(w, m)
	assert.Nil(t, w.msg, "zero Server answered %v", w.msg)
	assert.True(t, w.closed, "zero Server did not close the connection")
}

func TestAnswerFiltering(t *testing.T) {
	h := newHarness(t, []string{"*.test", "tenth.example"}, nil)
	tests := []struct {
		name    string
		qtype   uint16
		private bool
		want    string
		reason  string
	}{
		{"private.test", dns.TypeA, false, "", "private network (RFC 1918)"},
		{"private.test", dns.TypeA, true, "10.0.0.5", ""},
		{"meta.test", dns.TypeA, true, "", "metadata"},
		{"mixed.test", dns.TypeA, false, "140.82.112.4", "127.0.0.1 removed: never"},
		{"stray.test", dns.TypeA, false, "140.82.112.5", ""},
		{"svcb.test", dns.TypeHTTPS, false, "", "127.0.0.1 removed"},
		{"svcbok.test", dns.TypeHTTPS, false, "HTTPS", ""},
		{"txt.test", dns.TypeTXT, false, "TXT", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"*.test"}, AllowPrivateNetworks: tt.private})
			resp := h.query("udp", "127.0.0.1", tt.name, tt.qtype, false)
			assert.Equal(t, tt.want, strings.Join(answerStrings(resp), " "), "answers")
			assert.Equal(t, dns.RcodeSuccess, resp.Rcode, "rcode")
			if r := h.lastRecord(); tt.reason != "" {
				assert.Contains(t, r.Reason, tt.reason, "record reason")
			}
		})
	}
	assert.Empty(t, h.srv.Names("a1", netip.MustParseAddr("127.0.0.1")), "a removed address was remembered")
}

func TestCNAMEChain(t *testing.T) {
	h := newHarness(t, []string{"cname.test", "a.test", "cdn.test", "loop.test", "loop2.test", "twocname.test"}, nil)
	resp := h.query("udp", "127.0.0.1", "cname.test", dns.TypeA, false)
	assert.Equal(t, "CNAME a.test. 140.82.112.3", strings.Join(answerStrings(resp), " "), "allowed chain")
	assert.Equal(t, []string{"cname.test"}, h.srv.Names("a1", netip.MustParseAddr("140.82.112.3")), "remembered names: want the name the agent asked for")
	resp = h.query("udp", "127.0.0.1", "cdn.test", dns.TypeA, false)
	assert.Equal(t, dns.RcodeNameError, resp.Rcode, "chain to a denied name: rcode")
	assert.Empty(t, resp.Answer, "chain to a denied name: answers")
	r := h.lastRecord()
	assert.False(t, r.Allowed, "record %+v allowed", r)
	assert.Contains(t, r.Reason, "CNAME target edge.cdn.example", "record Reason")
	resp = h.query("udp", "127.0.0.1", "loop.test", dns.TypeA, false)
	assert.Equal(t, dns.RcodeSuccess, resp.Rcode, "CNAME loop: rcode")

	// A second CNAME of a name in the chain names what no one judged:
	// only the chain's own links reach the agent.
	resp = h.query("udp", "127.0.0.1", "twocname.test", dns.TypeA, false)
	assert.Equal(t, "CNAME a.test. 140.82.112.3", strings.Join(answerStrings(resp), " "), "a name with two CNAMEs")

	trusting := newHarness(t, []string{"cdn.test"}, func(s *Server) { s.TrustCNAME = true })
	resp = trusting.query("udp", "127.0.0.1", "cdn.test", dns.TypeA, false)
	assert.Equal(t, "CNAME edge.cdn.example. 140.82.112.9", strings.Join(answerStrings(resp), " "), "TrustCNAME")
}

func TestTruncatedUpstreamRetriesOverTCP(t *testing.T) {
	h := newHarness(t, []string{"big.test"}, nil)
	resp := h.query("tcp", "127.0.0.1", "big.test", dns.TypeA, false)
	assert.Equal(t, 60, len(resp.Answer), "over TCP: answers")
	assert.False(t, resp.Truncated, "over TCP: truncated")
	resp = h.query("udp", "127.0.0.1", "big.test", dns.TypeA, false)
	assert.True(t, resp.Truncated, "over UDP without EDNS: want TC set")
	assert.Less(t, len(resp.Answer), 60, "over UDP without EDNS: answers")
}

func TestUpstreamFailures(t *testing.T) {
	h := newHarness(t, []string{"slow.test", "wrongq.test", "a.test"}, nil)
	for _, name := range []string{"slow.test", "wrongq.test"} {
		resp := h.query("udp", "127.0.0.1", name, dns.TypeA, false)
		assert.Equal(t, dns.RcodeServerFailure, resp.Rcode, "%s: rcode, want SERVFAIL", name)
		r := h.lastRecord()
		assert.True(t, strings.HasPrefix(r.Reason, "upstream failed"), "%s: reason %q", name, r.Reason)
	}
	dead := newHarness(t, []string{"a.test"}, func(s *Server) { s.Upstreams = []string{deadUpstream(t)} })
	assert.Equal(t, dns.RcodeServerFailure, dead.query("udp", "127.0.0.1", "a.test", dns.TypeA, false).Rcode, "dead upstream: rcode")
	refused := newHarness(t, []string{"a.test"}, func(s *Server) { s.Upstreams = []string{closedUDPPort(t)} })
	assert.Equal(t, dns.RcodeServerFailure, refused.query("udp", "127.0.0.1", "a.test", dns.TypeA, false).Rcode, "refused upstream: rcode")
}

func closedUDPPort(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := pc.LocalAddr().String()
	pc.Close()
	return addr
}

func TestCache(t *testing.T) {
	h := newHarness(t, []string{"a.test", "zero.test", "nx.test"}, nil)
	for i := 0; i < 5; i++ {
		h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false)
		h.query("udp", "127.0.0.1", "zero.test", dns.TypeA, false)
		h.query("udp", "127.0.0.1", "nx.test", dns.TypeA, false)
	}
	assert.Equal(t, 1, h.up.count("a.test"), "times a.test reached upstream")
	assert.Equal(t, 1, h.up.count("zero.test"), "times a TTL 0 answer reached upstream (kept for minCacheTTL)")
	assert.Equal(t, 1, h.up.count("nx.test"), "times a negative answer reached upstream")
	resp := h.query("udp", "127.0.0.1", "nx.test", dns.TypeA, false)
	assert.Equal(t, dns.RcodeNameError, resp.Rcode, "cached NXDOMAIN: rcode")
	assert.Len(t, resp.Ns, 1, "cached NXDOMAIN: authority")
	// A cached answer is still judged by the current policy.
	h.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"zero.test"}})
	assert.Equal(t, dns.RcodeNameError, h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false).Rcode,
		"cached answer served after the name was removed from the policy: rcode")
}

func TestEDNSForwarding(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.SetEdns0(4096, true)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte("smuggled")}, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	c := dns.Client{Net: "udp", Timeout: 3 * time.Second}
	resp, _, err := c.Exchange(m, h.addr)
	require.NoError(t, err)
	if opt := resp.IsEdns0(); assert.NotNil(t, opt, "response lost EDNS0") {
		assert.True(t, opt.Do(), "response lost the DO bit: %v", opt)
	}
	h.up.mu.Lock()
	up := h.up.lastOpt
	h.up.mu.Unlock()
	require.NotNil(t, up, "upstream query lost EDNS0")
	assert.True(t, up.Do(), "upstream query lost the DO bit: %v", up)
	assert.Empty(t, up.Option, "client options reached upstream")
}

// TestUpstreamQuestionIsTheGatewaysOwn: the answer to a question is
// shared by every agent asking it, and cached for them, so the question
// upstream carries the gateway's flags, not the first asker's. An agent
// asking first without recursion, with checking disabled and without
// EDNS0 got the next asker "no data" (or unvalidated answers) before.
func TestUpstreamQuestionIsTheGatewaysOwn(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.RecursionDesired, m.CheckingDisabled = false, true
	c := dns.Client{Net: "udp", Timeout: 3 * time.Second}
	resp, _, err := c.Exchange(m, h.addr)
	require.NoError(t, err)
	assert.Equal(t, []string{"140.82.112.3"}, answerStrings(resp), "the first asker")
	h.up.mu.Lock()
	hdr, opt := h.up.last, h.up.lastOpt
	h.up.mu.Unlock()
	assert.True(t, hdr.RecursionDesired, "the upstream was asked not to recurse")
	assert.False(t, hdr.CheckingDisabled, "the upstream was asked not to validate")
	if assert.NotNil(t, opt, "the upstream was asked without EDNS0") {
		assert.EqualValues(t, upstreamUDPSize, opt.UDPSize())
	}
	assert.Equal(t, []string{"140.82.112.3"}, answerStrings(h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false)), "the next asker, from the cache")
	assert.Equal(t, 1, h.up.count("a.test"))
}

// TestForgetDuringAQuery: an answer that arrives after its agent was
// forgotten (removed, while its query waited upstream) is not
// remembered for it: an agent made again under the name inherits
// nothing of the removed one's.
func TestForgetDuringAQuery(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, func(s *Server) { s.Timeout = 3 * time.Second })
	h.up.mu.Lock()
	h.up.delay = 300 * time.Millisecond
	h.up.mu.Unlock()
	answered := make(chan *dns.Msg, 1)
	go func() { answered <- h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false) }()
	require.Eventually(t, func() bool { return h.up.count("a.test") == 1 }, 3*time.Second, 5*time.Millisecond, "the query did not reach the upstream")
	h.srv.Forget("a1")
	require.Equal(t, []string{"140.82.112.3"}, answerStrings(<-answered))
	assert.Empty(t, h.srv.Names("a1", netip.MustParseAddr("140.82.112.3")), "an answer that came after Forget was remembered")

	h.up.mu.Lock()
	h.up.delay = 0
	h.up.mu.Unlock()
	h.query("udp", "127.0.0.1", "a.test", dns.TypeAAAA, false)
	assert.Equal(t, []string{"a.test"}, h.srv.Names("a1", netip.MustParseAddr("2606:50c0:8000::153")), "an answer after Forget, to a new query, was not remembered")
}

// TestForgetAsTheQueryIsIdentified: an answer to a query whose agent was
// identified just before Forget is not remembered, over UDP and TCP; the
// next query's answer is.
func TestForgetAsTheQueryIsIdentified(t *testing.T) {
	var forgetNext atomic.Bool
	h := newHarness(t, []string{"a.test"}, func(s *Server) {
		agents := s.Agents
		s.Agents = func(src netip.Addr) (string, *policy.Policy, bool) {
			a, p, ok := agents(src)
			if ok && forgetNext.CompareAndSwap(true, false) {
				s.Forget(a) // the agent removed as its query is identified
			}
			return a, p, ok
		}
	})
	addr := netip.MustParseAddr("140.82.112.3")
	for _, network := range []string{"udp", "tcp"} {
		forgetNext.Store(true)
		require.Equal(t, []string{"140.82.112.3"}, answerStrings(h.query(network, "127.0.0.1", "a.test", dns.TypeA, false)))
		assert.Empty(t, h.srv.Names("a1", addr), "%s: an answer to a query identified before Forget was remembered", network)
		h.query(network, "127.0.0.1", "a.test", dns.TypeA, false)
		assert.Equal(t, []string{"a.test"}, h.srv.Names("a1", addr), "%s: the next query's answer was not remembered", network)
		h.srv.Forget("a1")
	}
}

func TestBadQueries(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	send := func(raw []byte) *dns.Msg {
		t.Helper()
		conn, err := net.Dial("udp", h.addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write(raw)
		require.NoError(t, err)
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 65535)
		n, err := conn.Read(buf)
		if err != nil {
			return nil // dropped
		}
		m := new(dns.Msg)
		require.NoError(t, m.Unpack(buf[:n]), "server sent an unparseable reply")
		return m
	}
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		require.NoError(t, err)
		return b
	}
	q := func(name string, qtype, class uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		m.Question[0].Qclass = class
		return m
	}

	two := q("a.test.", dns.TypeA, dns.ClassINET)
	two.Question = append(two.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	none := q("a.test.", dns.TypeA, dns.ClassINET)
	none.Question = nil
	withAnswer := q("a.test.", dns.TypeA, dns.ClassINET)
	withAnswer.Answer = []dns.RR{mustRR("a.test. 60 IN A 1.2.3.4")}
	response := q("a.test.", dns.TypeA, dns.ClassINET)
	response.Response = true
	update := q("a.test.", dns.TypeA, dns.ClassINET)
	update.Opcode = dns.OpcodeUpdate

	// A compression pointer that points at itself.
	loop := []byte{0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x0c, 0x00, 0x01, 0x00, 0x01}
	truncatedBody := pack(q("a.test.", dns.TypeA, dns.ClassINET))[:15]

	tests := []struct {
		name  string
		raw   []byte
		rcode int // -1: dropped
	}{
		{"chaos class", pack(q("version.bind.", dns.TypeTXT, dns.ClassCHAOS)), dns.RcodeFormatError},
		{"two questions", pack(two), dns.RcodeFormatError},
		{"no question", pack(none), dns.RcodeFormatError},
		{"answer in query", pack(withAnswer), dns.RcodeFormatError},
		{"update opcode", pack(update), dns.RcodeNotImplemented},
		{"response", pack(response), -1},
		{"compression loop", loop, dns.RcodeFormatError},
		{"truncated body", truncatedBody, dns.RcodeFormatError},
		{"short header", []byte{0x12, 0x34, 0x01}, -1},
		{"zone transfer", pack(q("a.test.", dns.TypeAXFR, dns.ClassINET)), dns.RcodeRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := send(tt.raw)
			if tt.rcode == -1 {
				assert.Nil(t, m, "answered, want dropped")
			} else if assert.NotNil(t, m, "dropped, want rcode %d", tt.rcode) {
				assert.Equal(t, tt.rcode, m.Rcode, "rcode")
			}
		})
	}
	assert.Zero(t, h.up.total(), "bad queries reached upstream: %v", h.up.queries)
}

func TestShutdownIsIdempotent(t *testing.T) {
	s := &Server{}
	require.NoError(t, s.Close())
	assert.NoError(t, s.Close(), "second Close")
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	assert.ErrorIs(t, s.Serve(pc, nil), ErrServerClosed, "Serve after Close")
}

// testWriter is a dns.ResponseWriter that keeps the reply, for calling the
// handler directly (the zero Server test and the fuzz target).
type testWriter struct {
	remote net.Addr
	msg    *dns.Msg
	closed bool
}

func (w *testWriter) LocalAddr() net.Addr       { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53} }
func (w *testWriter) RemoteAddr() net.Addr      { return w.remote }
func (w *testWriter) WriteMsg(m *dns.Msg) error { w.msg = m; return nil }
func (w *testWriter) Write(b []byte) (int, error) {
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		return 0, err
	}
	w.msg = m
	return len(b), nil
}
func (w *testWriter) Close() error        { w.closed = true; return nil }
func (w *testWriter) TsigStatus() error   { return nil }
func (w *testWriter) TsigTimersOnly(bool) {}
func (w *testWriter) Hijack()             {}

func TestLookupNetIP(t *testing.T) {
	h := newHarness(t, nil, nil) // the gateway's own lookups ignore policy
	addrs, err := h.srv.LookupNetIP(context.Background(), "ip", "a.test")
	require.NoError(t, err, "ip")
	assert.Len(t, addrs, 2, "ip")
	addrs, err = h.srv.LookupNetIP(context.Background(), "ip4", "cname.test")
	require.NoError(t, err, "ip4 through a CNAME")
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("140.82.112.3")}, addrs, "ip4 through a CNAME")
	_, err = h.srv.LookupNetIP(context.Background(), "ip", "nx.test")
	assert.Error(t, err, "NXDOMAIN resolved")
	before := h.up.count("a.test")
	h.srv.LookupNetIP(context.Background(), "ip", "a.test")
	assert.Equal(t, before, h.up.count("a.test"), "a cached answer went upstream again")
	assert.Empty(t, h.log.List(egresslog.Filter{}, 0), "the gateway's own lookups were recorded as an agent's")
}
