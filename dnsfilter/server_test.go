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
		if err := <-done; err != ErrServerClosed {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return h
}

func (h *harness) setPolicy(cfg policy.Config) {
	p, err := policy.New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
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
	if err != nil {
		h.t.Fatalf("query %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return resp
}

func (h *harness) lastRecord() egresslog.Record {
	h.t.Helper()
	rs := h.log.List(egresslog.Filter{}, 1)
	if len(rs) != 1 {
		h.t.Fatal("no record")
	}
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
		if resp.Rcode != dns.RcodeSuccess || strings.Join(answerStrings(resp), " ") != "140.82.112.3" {
			t.Fatalf("%s: rcode %d answers %v", network, resp.Rcode, answerStrings(resp))
		}
	}
	resp := h.query("udp", "127.0.0.1", "a.test", dns.TypeAAAA, true)
	if strings.Join(answerStrings(resp), " ") != "2606:50c0:8000::153" {
		t.Fatalf("AAAA answers %v", answerStrings(resp))
	}
	if names := h.srv.Names("a1", netip.MustParseAddr("140.82.112.3")); len(names) != 1 || names[0] != "A.Test" && names[0] != "a.test" {
		t.Errorf("Names(140.82.112.3) = %v", names)
	}
	if names := h.srv.Names("a1", netip.MustParseAddr("2606:50c0:8000::153")); len(names) != 1 {
		t.Errorf("Names(AAAA) = %v", names)
	}
	if names := h.srv.Names("other", netip.MustParseAddr("140.82.112.3")); len(names) != 0 {
		t.Errorf("another agent sees a1's names: %v", names)
	}
	r := h.lastRecord()
	if r.Agent != "a1" || r.Kind != egresslog.KindDNS || r.Method != "AAAA" || !r.Allowed || r.Answers != 1 || r.Rule != "a.test" {
		t.Errorf("record = %+v", r)
	}
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
			if resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
				t.Errorf("%s over %s: rcode %d, %d answers; want NXDOMAIN", d.name, network, resp.Rcode, len(resp.Answer))
			}
			if e := ede(resp); e == nil || e.InfoCode != dns.ExtendedErrorCodeBlocked {
				t.Errorf("%s: no EDE Blocked in %v", d.name, resp.IsEdns0())
			}
			r := h.lastRecord()
			if r.Allowed || r.Reason != policy.ReasonNoRule || r.Status != dns.RcodeNameError {
				t.Errorf("%s: record %+v", d.name, r)
			}
		}
	}
	if n := h.up.total(); n != 0 {
		t.Fatalf("denied names caused %d upstream queries: %v", n, h.up.queries)
	}
}

func TestDenyAllStillAnswers(t *testing.T) {
	h := newHarness(t, nil, nil)
	h.pol.Store(policy.Deny(policy.ReasonFileAbsent))
	resp := h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false)
	if resp.Rcode != dns.RcodeNameError {
		t.Fatalf("rcode %d, want NXDOMAIN", resp.Rcode)
	}
	if r := h.lastRecord(); r.Reason != policy.ReasonFileAbsent {
		t.Errorf("reason %q", r.Reason)
	}
	if h.up.total() != 0 {
		t.Fatal("deny-all forwarded a query")
	}
}

func TestUnknownSourceRefused(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	for _, network := range []string{"udp", "tcp"} {
		resp := h.query(network, "127.0.0.2", "a.test", dns.TypeA, true)
		if resp.Rcode != dns.RcodeRefused {
			t.Fatalf("%s: rcode %d, want REFUSED", network, resp.Rcode)
		}
		if e := ede(resp); e == nil || e.InfoCode != dns.ExtendedErrorCodeBlocked {
			t.Errorf("no EDE Blocked")
		}
	}
	if h.up.total() != 0 {
		t.Fatal("an unknown source's query was forwarded")
	}
	if r := h.lastRecord(); r.Reason != ReasonUnknownSource || r.Allowed {
		t.Errorf("record %+v", r)
	}
	// The zero Server knows no agent and refuses everything.
	var zero Server
	w := &testWriter{remote: &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5353}}
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	zero.ServeDNS(w, m)
	if w.msg == nil || w.msg.Rcode != dns.RcodeRefused {
		t.Fatalf("zero Server answered %v", w.msg)
	}
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
			if got := strings.Join(answerStrings(resp), " "); got != tt.want || resp.Rcode != dns.RcodeSuccess {
				t.Errorf("answers %q rcode %d, want %q", got, resp.Rcode, tt.want)
			}
			if r := h.lastRecord(); tt.reason != "" && !strings.Contains(r.Reason, tt.reason) {
				t.Errorf("record reason %q, want it to contain %q", r.Reason, tt.reason)
			}
		})
	}
	if names := h.srv.Names("a1", netip.MustParseAddr("127.0.0.1")); len(names) != 0 {
		t.Errorf("a removed address was remembered: %v", names)
	}
}

func TestCNAMEChain(t *testing.T) {
	h := newHarness(t, []string{"cname.test", "a.test", "cdn.test", "loop.test", "loop2.test"}, nil)
	resp := h.query("udp", "127.0.0.1", "cname.test", dns.TypeA, false)
	if got := strings.Join(answerStrings(resp), " "); got != "CNAME a.test. 140.82.112.3" {
		t.Errorf("allowed chain: %q", got)
	}
	if names := h.srv.Names("a1", netip.MustParseAddr("140.82.112.3")); len(names) != 1 || names[0] != "cname.test" {
		t.Errorf("remembered %v, want the name the agent asked for", names)
	}
	resp = h.query("udp", "127.0.0.1", "cdn.test", dns.TypeA, false)
	if resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
		t.Errorf("chain to a denied name: rcode %d answers %v", resp.Rcode, answerStrings(resp))
	}
	if r := h.lastRecord(); r.Allowed || !strings.Contains(r.Reason, "CNAME target edge.cdn.example") {
		t.Errorf("record %+v", r)
	}
	resp = h.query("udp", "127.0.0.1", "loop.test", dns.TypeA, false)
	if resp.Rcode != dns.RcodeSuccess {
		t.Errorf("CNAME loop: rcode %d", resp.Rcode)
	}

	trusting := newHarness(t, []string{"cdn.test"}, func(s *Server) { s.TrustCNAME = true })
	resp = trusting.query("udp", "127.0.0.1", "cdn.test", dns.TypeA, false)
	if got := strings.Join(answerStrings(resp), " "); got != "CNAME edge.cdn.example. 140.82.112.9" {
		t.Errorf("TrustCNAME: %q", got)
	}
}

func TestTruncatedUpstreamRetriesOverTCP(t *testing.T) {
	h := newHarness(t, []string{"big.test"}, nil)
	resp := h.query("tcp", "127.0.0.1", "big.test", dns.TypeA, false)
	if len(resp.Answer) != 60 || resp.Truncated {
		t.Fatalf("over TCP: %d answers, truncated=%v", len(resp.Answer), resp.Truncated)
	}
	resp = h.query("udp", "127.0.0.1", "big.test", dns.TypeA, false)
	if !resp.Truncated || len(resp.Answer) >= 60 {
		t.Fatalf("over UDP without EDNS: %d answers, truncated=%v; want TC set", len(resp.Answer), resp.Truncated)
	}
}

func TestUpstreamFailures(t *testing.T) {
	h := newHarness(t, []string{"slow.test", "wrongq.test", "a.test"}, nil)
	for _, name := range []string{"slow.test", "wrongq.test"} {
		resp := h.query("udp", "127.0.0.1", name, dns.TypeA, false)
		if resp.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s: rcode %d, want SERVFAIL", name, resp.Rcode)
		}
		if r := h.lastRecord(); !strings.HasPrefix(r.Reason, "upstream failed") {
			t.Errorf("%s: reason %q", name, r.Reason)
		}
	}
	dead := newHarness(t, []string{"a.test"}, func(s *Server) { s.Upstreams = []string{deadUpstream(t)} })
	if resp := dead.query("udp", "127.0.0.1", "a.test", dns.TypeA, false); resp.Rcode != dns.RcodeServerFailure {
		t.Errorf("dead upstream: rcode %d", resp.Rcode)
	}
	refused := newHarness(t, []string{"a.test"}, func(s *Server) { s.Upstreams = []string{closedUDPPort(t)} })
	if resp := refused.query("udp", "127.0.0.1", "a.test", dns.TypeA, false); resp.Rcode != dns.RcodeServerFailure {
		t.Errorf("refused upstream: rcode %d", resp.Rcode)
	}
}

func closedUDPPort(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	if n := h.up.count("a.test"); n != 1 {
		t.Errorf("a.test reached upstream %d times, want 1", n)
	}
	if n := h.up.count("zero.test"); n != 5 {
		t.Errorf("a TTL 0 answer reached upstream %d times, want 5 (not cached)", n)
	}
	if n := h.up.count("nx.test"); n != 1 {
		t.Errorf("a negative answer reached upstream %d times, want 1", n)
	}
	resp := h.query("udp", "127.0.0.1", "nx.test", dns.TypeA, false)
	if resp.Rcode != dns.RcodeNameError || len(resp.Ns) != 1 {
		t.Errorf("cached NXDOMAIN: rcode %d, authority %v", resp.Rcode, resp.Ns)
	}
	// A cached answer is still judged by the current policy.
	h.setPolicy(policy.Config{Mode: policy.Allowlist, Allow: []string{"zero.test"}})
	if resp := h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false); resp.Rcode != dns.RcodeNameError {
		t.Errorf("cached answer served after the name was removed from the policy: rcode %d", resp.Rcode)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	if resp.IsEdns0() == nil || !resp.IsEdns0().Do() {
		t.Errorf("response lost EDNS0 or the DO bit: %v", resp.IsEdns0())
	}
	h.up.mu.Lock()
	up := h.up.lastOpt
	h.up.mu.Unlock()
	if up == nil || !up.Do() {
		t.Fatalf("upstream query lost EDNS0 or the DO bit: %v", up)
	}
	if len(up.Option) != 0 {
		t.Errorf("client options reached upstream: %v", up.Option)
	}
}

func TestBadQueries(t *testing.T) {
	h := newHarness(t, []string{"a.test"}, nil)
	send := func(raw []byte) *dns.Msg {
		t.Helper()
		conn, err := net.Dial("udp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write(raw); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 65535)
		n, err := conn.Read(buf)
		if err != nil {
			return nil // dropped
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			t.Fatalf("server sent an unparseable reply: %v", err)
		}
		return m
	}
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
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
			switch {
			case tt.rcode == -1 && m != nil:
				t.Errorf("answered %v, want dropped", m)
			case tt.rcode != -1 && m == nil:
				t.Errorf("dropped, want rcode %d", tt.rcode)
			case m != nil && m.Rcode != tt.rcode:
				t.Errorf("rcode %d, want %d", m.Rcode, tt.rcode)
			}
		})
	}
	if h.up.total() != 0 {
		t.Fatalf("bad queries reached upstream: %v", h.up.queries)
	}
}

func TestShutdownIsIdempotent(t *testing.T) {
	s := &Server{}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(pc, nil); err != ErrServerClosed {
		t.Fatalf("Serve after Close = %v", err)
	}
}

// testWriter is a dns.ResponseWriter that keeps the reply, for calling the
// handler directly (the zero Server test and the fuzz target).
type testWriter struct {
	remote net.Addr
	msg    *dns.Msg
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
func (w *testWriter) Close() error        { return nil }
func (w *testWriter) TsigStatus() error   { return nil }
func (w *testWriter) TsigTimersOnly(bool) {}
func (w *testWriter) Hijack()             {}

func TestLookupNetIP(t *testing.T) {
	h := newHarness(t, nil, nil) // the gateway's own lookups ignore policy
	addrs, err := h.srv.LookupNetIP(context.Background(), "ip", "a.test")
	if err != nil || len(addrs) != 2 {
		t.Fatalf("ip: %v, %v", addrs, err)
	}
	addrs, err = h.srv.LookupNetIP(context.Background(), "ip4", "cname.test")
	if err != nil || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("140.82.112.3") {
		t.Fatalf("ip4 through a CNAME: %v, %v", addrs, err)
	}
	if _, err := h.srv.LookupNetIP(context.Background(), "ip", "nx.test"); err == nil {
		t.Fatal("NXDOMAIN resolved")
	}
	before := h.up.count("a.test")
	h.srv.LookupNetIP(context.Background(), "ip", "a.test")
	if h.up.count("a.test") != before {
		t.Error("a cached answer went upstream again")
	}
	if len(h.log.List(egresslog.Filter{}, 0)) != 0 {
		t.Error("the gateway's own lookups were recorded as an agent's")
	}
}
