package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/budget"
	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("dnsfilter: server closed")

// Defaults for a Server's zero fields.
const (
	DefaultTimeout             = 2 * time.Second
	DefaultMaxInFlight         = 1024
	DefaultMaxInFlightPerAgent = 64
	DefaultGatewayInFlight     = 256
	// DNS over TCP connections open at once, per source and in all.
	DefaultMaxTCPConnsPerSource    = 32
	DefaultMaxTCPConns             = 1024
	DefaultGatewayInFlightPerAgent = 32
)

// Reasons recorded for queries that never reach the policy.
const (
	ReasonBadClass        = "query class is not IN"
	ReasonZoneTransfer    = "zone transfers are refused"
	ReasonQueryType       = "query type not forwarded"
	ReasonOverloaded      = "too many queries in flight"
	ReasonAgentOverloaded = "too many of this agent's queries in flight"
	ReasonGatewayBusy     = "too many of the gateway's own lookups in flight"
)

// BoundReasons are the reasons of refusals for the bounds on queries in
// flight, which whoever counts refusals per agent counts however many
// other reasons an agent provokes.
func BoundReasons() []string {
	return []string{ReasonOverloaded, ReasonAgentOverloaded, ReasonGatewayBusy}
}

// Server is the sandboxes' DNS server. The zero Server refuses every query
// (it knows no agent); set Agents to serve. A Server is safe for
// concurrent use; set its fields before serving.
type Server struct {
	// Agents identifies the agent behind a query's source address; nil,
	// or an unknown source, is refused. Agents must have names: "" is the
	// key of the gateway's own lookups made for no agent.
	Agents policy.AgentFunc
	// Upstreams are the resolvers allowed names go to, as "host:port",
	// tried in order; nil means the name servers of /etc/resolv.conf.
	Upstreams []string
	// Guard classifies answer addresses; nil means netguard's built-in
	// classification.
	Guard *netguard.Guard
	// Log receives one record per query; nil records nothing.
	Log *egresslog.Log
	// Logger receives operational messages; nil discards them.
	Logger *slog.Logger
	// Timeout bounds the upstream exchange of one query; zero means
	// DefaultTimeout.
	Timeout time.Duration
	// TrustCNAME accepts CNAME targets the policy does not name. By default
	// every name in a CNAME chain must be allowed.
	TrustCNAME bool
	// CacheSize bounds the answer cache; zero means DefaultCacheSize, and a
	// negative size disables the cache.
	CacheSize int
	// MinTTL and MaxTTL bound how long an answer's addresses are remembered
	// for Names; zero means DefaultMinTTL and DefaultMaxTTL.
	MinTTL, MaxTTL time.Duration
	// MemoryPerAgent bounds the remembered (address, name) pairs per agent;
	// zero means DefaultMemoryPerAgent.
	MemoryPerAgent int
	// MaxInFlight bounds the sandboxes' queries waiting for an upstream,
	// and MaxInFlightPerAgent each agent's share of them; beyond either,
	// new queries get SERVFAIL at once, and other agents' are untouched
	// (the last quarter is kept for agents that ask little, budget.Fair;
	// none is with MaxInFlightPerAgent at or above MaxInFlight, when one
	// agent may take it all).
	// Zero means DefaultMaxInFlight and DefaultMaxInFlightPerAgent. An
	// agent's query rate is its policy's quota (policy.Quotas).
	MaxInFlight, MaxInFlightPerAgent int
	// GatewayInFlight bounds the gateway's own lookups (LookupNetIP)
	// waiting for an upstream, a budget apart from the sandboxes', and
	// GatewayInFlightPerAgent the share of it a lookup made for one agent
	// (policy.WithAgent on its context) may take, so that no agent's flood
	// of names can keep the gateway from resolving what others dial. Zero
	// means DefaultGatewayInFlight and DefaultGatewayInFlightPerAgent.
	GatewayInFlight, GatewayInFlightPerAgent int
	// Tunnel tunes the detection of DNS tunnelling under permissive
	// policies (see TunnelDetection); the zero value records suspect
	// queries and refuses none.
	Tunnel TunnelDetection
	// Approver, if set, is asked about the names a policy in ask mode
	// would refuse for want of an entry: the query is held (within the
	// agent's in-flight share) until it answers. Shutdown ends the wait.
	Approver policy.Approver

	initOnce  sync.Once
	life      context.Context // ends at Shutdown: the waits for approval
	endLife   context.CancelFunc
	tunnel    *tunnelDetector
	cache     *cache
	mem       *memory
	flight    singleflight.Group
	inFlight  budget.Counter // the sandboxes' queries, per agent
	handling  budget.Counter // UDP queries being answered, per agent
	gateway   budget.Counter // the gateway's own lookups, per agent they are for
	rates     budget.Rates   // queries per second, per agent
	upstreams []string
	upErr     error

	unknownSources, malformed, repliesDropped atomic.Uint64

	mu       sync.Mutex
	servers  []runner       // started, and not yet shut down
	starting sync.WaitGroup // Serve calls starting their servers; Add only under mu while !closed
	closed   bool
}

// runner is one connection being served: UDP by the server's own loop,
// TCP by miekg/dns.
type runner interface {
	run(started func()) error
	shutdown(ctx context.Context) error
	abort() // closes the connection of a runner that never started
}

func (u *udpServer) abort() { u.pc.Close() }

// tcpServer serves DNS over TCP with miekg/dns.
type tcpServer struct{ d *dns.Server }

func (t tcpServer) run(started func()) error {
	t.d.NotifyStartedFunc = started
	return t.d.ActivateAndServe()
}

func (t tcpServer) shutdown(ctx context.Context) error { return t.d.ShutdownContext(ctx) }

func (t tcpServer) abort() { t.d.Listener.Close() }

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.life, s.endLife = context.WithCancel(context.Background())
		if s.CacheSize >= 0 {
			s.cache = newCache(cmp(s.CacheSize, DefaultCacheSize))
		}
		s.mem = newMemory(cmpDur(s.MinTTL, DefaultMinTTL), cmpDur(s.MaxTTL, DefaultMaxTTL), cmp(s.MemoryPerAgent, DefaultMemoryPerAgent))
		s.tunnel = newTunnelDetector(s.Tunnel)
		s.upstreams = s.Upstreams
		if s.upstreams == nil {
			s.upstreams, s.upErr = SystemUpstreams()
			if s.upErr != nil {
				s.logger().Error("no upstream resolver: allowed names will get SERVFAIL", "err", s.upErr)
			}
		}
	})
}

func cmp(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func cmpDur(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Names returns the names that addr was an answer for, to this agent,
// within their remembered TTL: what tproxy judges other TCP by.
func (s *Server) Names(agent string, addr netip.Addr) []string {
	s.init()
	return s.mem.names(agent, addr, time.Now())
}

// Forget drops what the server remembers for an agent: its answers, what
// it learnt of its names for tunnel detection, and its query rate, so
// that an agent made later under the same name starts afresh.
func (s *Server) Forget(agent string) {
	s.init()
	s.mem.forgetAgent(agent)
	s.tunnel.forget(agent)
	s.rates.Forget(agent)
}

// ListenAndServe serves DNS over UDP and TCP on addr.
func (s *Server) ListenAndServe(addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("dnsfilter: %w", err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		return fmt.Errorf("dnsfilter: %w", err)
	}
	return s.Serve(pc, ln)
}

// Serve answers queries on pc (UDP) and ln (TCP), either of which may be
// nil, until Shutdown or Close; it then returns ErrServerClosed. It takes
// ownership of both.
func (s *Server) Serve(pc net.PacketConn, ln net.Listener) error {
	s.init()
	var servers []runner
	if pc != nil {
		servers = append(servers, newUDPServer(s, pc))
	}
	if ln != nil {
		// TCP connections are bounded per source, so that held-open
		// connections cannot pile up.
		ln = &budget.Listener{Listener: ln, PerSource: DefaultMaxTCPConnsPerSource, Total: DefaultMaxTCPConns}
		servers = append(servers, tcpServer{&dns.Server{
			Listener:      ln,
			Net:           "tcp",
			Handler:       s,
			MsgAcceptFunc: acceptQuery,
			ReadTimeout:   5 * time.Second,
			WriteTimeout:  5 * time.Second,
			IdleTimeout:   func() time.Duration { return 10 * time.Second },
		}})
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		for _, r := range servers {
			r.abort()
		}
		return ErrServerClosed
	}
	// A Shutdown that lands while the servers start waits for them, then
	// shuts down what started: a miekg server that is not yet started
	// cannot be shut down, and would serve forever.
	s.starting.Add(1)
	s.mu.Unlock()

	errc := make(chan error, len(servers))
	for n, r := range servers {
		up := make(chan struct{})
		go func() { errc <- r.run(func() { close(up) }) }()
		select {
		case <-up:
		case err := <-errc:
			s.registerStarted(nil)
			for _, r := range servers[:n] {
				r.shutdown(context.Background())
				<-errc
			}
			for _, r := range servers {
				r.abort()
			}
			return fmt.Errorf("dnsfilter: %w", err)
		}
	}
	s.registerStarted(servers)

	var first error
	for range servers {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrServerClosed
	}
	return first
}

// registerStarted registers servers that have started, so that Shutdown
// reaches them, and releases any Shutdown waiting for them.
func (s *Server) registerStarted(servers []runner) {
	s.mu.Lock()
	s.servers = append(s.servers, servers...)
	s.mu.Unlock()
	s.starting.Done()
}

// Shutdown stops serving and waits for queries in progress, until ctx is
// done.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	s.endLife() // no query waits for approval any longer
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.starting.Wait() // bounded: a miekg server starts or fails without waiting on a client
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	var errs []error
	for _, r := range servers {
		if err := r.shutdown(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close stops serving at once, without waiting for queries in progress.
// It is safe to call more than once.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// acceptQuery admits standard queries with one question and nothing in
// the answer and authority sections; responses are ignored (never
// answered, so that the server cannot be turned on itself); other opcodes
// get NOTIMP; anything else gets FORMERR.
func acceptQuery(h dns.Header) dns.MsgAcceptAction {
	const qrBit = 1 << 15
	switch {
	case h.Bits&qrBit != 0:
		return dns.MsgIgnore
	case int(h.Bits>>11)&0xF != dns.OpcodeQuery:
		return dns.MsgRejectNotImplemented
	case h.Qdcount != 1, h.Ancount != 0, h.Nscount != 0, h.Arcount > 1:
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// identify names the agent behind a source address.
func (s *Server) identify(src netip.Addr) (string, *policy.Policy, bool) {
	if s.Agents == nil || !src.IsValid() {
		return "", nil, false
	}
	return s.Agents(src)
}

// ServeDNS answers one query that arrived over TCP (or through a caller's
// own dns.Server); it implements dns.Handler. A query from a source no
// agent owns is not answered: its connection is closed, and counted.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	s.init()
	src, _ := remoteAddr(w)
	seen := s.mem.seen()
	agent, pol, ok := s.identify(src)
	if !ok {
		s.unknownSources.Add(1)
		w.Close()
		return
	}
	s.serveQuery(w, req, src, agent, pol, seen, isUDP(w))
}

// serveQuery answers one query of agent's from src, and records it; seen
// is the memory's count of Forgets before the agent was identified.
func (s *Server) serveQuery(w dns.ResponseWriter, req *dns.Msg, src netip.Addr, agent string, pol *policy.Policy, seen uint64, udp bool) {
	start := time.Now()
	current := func() *policy.Policy { // the agent's policy when an approval comes
		if a, p, ok := s.identify(src); ok && a == agent {
			return p
		}
		return nil
	}
	resp, rec := s.answer(req, agent, pol, seen, current)
	rec.Time = start
	rec.Status = resp.Rcode
	rec.Answers = len(resp.Answer)
	rec.Duration = time.Since(start)
	s.record(rec)
	size := dns.MaxMsgSize
	if udp {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(dns.MinMsgSize, min(int(opt.UDPSize()), upstreamUDPSize))
		}
	}
	resp.Truncate(size)
	if err := w.WriteMsg(resp); err != nil {
		s.logger().Debug("dns write failed", "err", err)
	}
}

func (s *Server) record(r egresslog.Record) {
	if s.Log != nil {
		s.Log.Record(r)
	}
}

// queryRecord is the start of a query's record: its name, canonical when
// it is a valid one, and its type.
func queryRecord(req *dns.Msg) egresslog.Record {
	rec := egresslog.Record{Kind: egresslog.KindDNS}
	if len(req.Question) > 0 {
		q := req.Question[0]
		rec.Host = canonicalQuestion(q.Name)
		rec.Method = typeString(q.Qtype)
	}
	return rec
}

// canonicalQuestion is a question's name in canonical form, or as sent
// (without its trailing dot) when it is not a valid name: the policy
// refuses it then, and the record shows what was asked.
func canonicalQuestion(name string) string {
	if n, err := hostname.Normalize(name); err == nil {
		return n
	}
	return strings.TrimSuffix(name, ".")
}

// answer decides and builds the response to one query of agent's, and
// the record of it.
func (s *Server) answer(req *dns.Msg, agent string, pol *policy.Policy, seen uint64, current policy.Current) (*dns.Msg, egresslog.Record) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	rec := queryRecord(req)
	rec.Agent = agent
	// The memory what the answer teaches goes to, taken before anything
	// the query waits for (a person, the upstream): if Forget comes
	// meanwhile, or came since the agent was identified, the answer is
	// not remembered.
	mem := s.mem.held(agent, seen)
	opt := req.IsEdns0()
	if opt != nil {
		resp.SetEdns0(upstreamUDPSize, opt.Do())
	}
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		rec.Reason = "not exactly one question"
		return resp, rec
	}
	q := req.Question[0]
	q0 := pol.Quotas().DNSQueriesPerSecond
	switch {
	case !s.rates.Take(agent, 1, q0, 2*q0, time.Now()):
		resp.Rcode = dns.RcodeRefused
		return resp, withReason(rec, policy.ReasonQuotaDNS)
	case q.Qclass != dns.ClassINET:
		resp.Rcode = dns.RcodeFormatError
		return resp, withReason(rec, ReasonBadClass)
	case q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR:
		resp.Rcode = dns.RcodeRefused
		return resp, withReason(rec, ReasonZoneTransfer)
	}
	d := pol.DecideName(rec.Host)
	if !forwarded(q.Qtype) && (d.Allowed || d.Askable) {
		// A type never forwarded is not worth asking a person about.
		rec.Allowed, rec.Reason, rec.Rule = false, ReasonQueryType, d.Rule
		resp.Rcode = dns.RcodeNotImplemented
		return resp, rec
	}
	d = policy.Ask(s.life, s.Approver, agent, d, 0, string(egresslog.KindDNS), current)
	rec.Allowed, rec.Report, rec.Reason, rec.Rule = d.Allowed, d.Report, d.Reason, d.Rule
	if !d.Allowed {
		return blocked(resp, dns.RcodeNameError, d.Reason), rec
	}
	do := opt != nil && opt.Do()
	suspect := s.suspectTunnel(agent, rec.Host, q.Qtype, do)
	if suspect != "" && s.Tunnel.Refuse {
		rec.Allowed, rec.Reason = false, suspect
		return blocked(resp, dns.RcodeRefused, ReasonTunnel), rec
	}

	ctx, cancel := context.WithTimeout(context.Background(), cmpDur(s.Timeout, DefaultTimeout))
	defer cancel()
	up, age, err := s.resolve(ctx, asker{agent: agent}, rec.Host, q, do)
	var busy overBudget
	switch {
	case errors.As(err, &busy): // a bound this agent met: a refusal, not a failure
		resp.Rcode = dns.RcodeServerFailure
		rec.Allowed, rec.Reason = false, string(busy)
		return resp, rec
	case err != nil:
		resp.Rcode = dns.RcodeServerFailure
		rec.Reason = "upstream failed: " + err.Error()
		return resp, rec
	}
	a := filter(up, q, filterOptions{
		policy:       pol,
		guard:        s.Guard,
		allowPrivate: pol.AllowPrivateNetworks(),
		trustCNAME:   s.TrustCNAME,
		approved:     d.Approved,
		age:          age,
	})
	if a.denied {
		rec.Allowed, rec.Reason, rec.Rule = d.Report, a.why, a.rule
		if !d.Report {
			return blocked(resp, dns.RcodeNameError, a.why), rec
		}
	}
	resp.Rcode = a.rcode
	resp.Answer = a.records
	resp.Ns = a.soa
	if a.removed > 0 {
		rec.Reason = a.why
	}
	if suspect != "" {
		rec.Reason = suspect
	}
	now := time.Now()
	for _, r := range a.addrs {
		s.mem.rememberIn(mem, agent, r.addr, rec.Host, r.ttl, now)
	}
	return resp, rec
}

// forwardedTypes are the query types sent upstream, each with its bit in
// the tunnelling counters: what applications ask. Any other type is
// refused (NOTIMP): each would be a new question about the same name,
// and its number a channel of its own.
var forwardedTypes = map[uint16]uint{
	dns.TypeA: 0, dns.TypeAAAA: 1, dns.TypeCNAME: 2, dns.TypeHTTPS: 3, dns.TypeSVCB: 4,
	dns.TypeTXT: 5, dns.TypeMX: 6, dns.TypeSRV: 7, dns.TypeNS: 8, dns.TypeSOA: 9,
	dns.TypeCAA: 10, dns.TypePTR: 11, dns.TypeDS: 12, dns.TypeDNSKEY: 13, dns.TypeTLSA: 14,
	dns.TypeNAPTR: 15, dns.TypeSSHFP: 16,
}

func forwarded(qtype uint16) bool {
	_, ok := forwardedTypes[qtype]
	return ok
}

// suspectTunnel counts agent's lookup of name towards tunnelling (asked
// with the DNSSEC OK bit do or not, which the cache tells apart), and
// says why it is suspect ("" if it is not), logging when the agent's
// lookups under the name's zone become so.
func (s *Server) suspectTunnel(agent, name string, qtype uint16, do bool) string {
	now := time.Now()
	upstream := s.cache == nil || !s.cache.has(cacheKey{name: dns.Fqdn(name), qtype: qtype, do: do}, now)
	sus := s.tunnel.observe(agent, name, qtype, upstream, now)
	if sus.changed {
		s.logger().Warn(ReasonTunnel, "agent", agent, "name", name, "why", sus.why, "refused", s.Tunnel.Refuse)
	}
	return sus.why
}

// asker is who waits for an answer: an agent's query, or the gateway's
// own lookup (for an agent, or "" for none).
type asker struct {
	agent   string
	gateway bool
}

// resolve returns the upstream answer to q, from the cache or from one
// exchange shared by every concurrent asker, and how long it was cached.
// An asker waiting for the upstream takes a place in its budget: its
// agent's share of the sandboxes' queries, or of the gateway's lookups;
// none left is an error at once. The wait ends with ctx.
func (s *Server) resolve(ctx context.Context, who asker, name string, q dns.Question, do bool) (*dns.Msg, time.Duration, error) {
	key := cacheKey{name: dns.Fqdn(name), qtype: q.Qtype, do: do}
	now := time.Now()
	if s.cache != nil {
		if m, age, ok := s.cache.get(key, now); ok {
			return m, age, nil
		}
	}
	if s.upErr != nil {
		return nil, 0, s.upErr
	}
	agent := who.agent
	switch {
	case who.gateway:
		perAgent := cmp(s.GatewayInFlightPerAgent, DefaultGatewayInFlightPerAgent)
		if agent == "" {
			perAgent = 0 // the gateway's lookups for no agent share only the total
		}
		if !s.gateway.Acquire(agent, perAgent, cmp(s.GatewayInFlight, DefaultGatewayInFlight)) {
			return nil, 0, overBudget(ReasonGatewayBusy)
		}
		defer s.gateway.Release(agent)
	default:
		bound := s.inFlight.Take(agent, cmp(s.MaxInFlightPerAgent, DefaultMaxInFlightPerAgent), cmp(s.MaxInFlight, DefaultMaxInFlight))
		if why := bound.Reason(ReasonAgentOverloaded, ReasonOverloaded); why != "" {
			return nil, 0, overBudget(why)
		}
		defer s.inFlight.Release(agent)
	}
	flightKey := key.name + "/" + strconv.Itoa(int(key.qtype)) + "/" + strconv.FormatBool(do)
	ch := s.flight.DoChan(flightKey, func() (any, error) {
		q.Name = key.name // ask in canonical form; the answer is matched case-insensitively
		// One exchange for every asker: bounded by the timeout, not by
		// the first asker's context.
		m, err := exchange(context.Background(), s.upstreams, upstreamQuery(q, do), cmpDur(s.Timeout, DefaultTimeout))
		if err != nil {
			return nil, err
		}
		if s.cache != nil {
			s.cache.put(agent, key, m, time.Now())
		}
		return m, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, 0, r.Err
		}
		return r.Val.(*dns.Msg), 0, nil
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
}

// overBudget is resolve's refusal when a budget of in-flight queries is
// spent; it is the reason.
type overBudget string

func (e overBudget) Error() string { return string(e) }

// blocked sets rcode and, when the client speaks EDNS0, an Extended DNS
// Error "Blocked" (RFC 8914) saying why.
func blocked(resp *dns.Msg, rcode int, why string) *dns.Msg {
	resp.Rcode = rcode
	if opt := resp.IsEdns0(); opt != nil {
		opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeBlocked, ExtraText: why})
	}
	return resp
}

func withReason(r egresslog.Record, why string) egresslog.Record {
	r.Reason = why
	return r
}

func typeString(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

func remoteAddr(w dns.ResponseWriter) (netip.Addr, bool) {
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap(), true
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

func isUDP(w dns.ResponseWriter) bool {
	_, ok := w.RemoteAddr().(*net.UDPAddr)
	return ok
}
