package dnsfilter

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/agenthold/egress/policy"
)

// The UDP door. Every UDP query passes serveUDP's read loop, which is
// where "who may send" is enforced for DNS: a packet whose source names
// no agent is dropped, unanswered and unrecorded (counted in Counters), so
// that spoofed sources can neither fill the log nor have the server send
// answers into the void on their behalf; a known agent's query takes a
// place among the queries being answered, its own share and the total
// (MaxInFlightPerAgent, MaxInFlight: twice those, since a query waiting
// for its upstream also holds one), or is refused at once; and a reply
// that finds the socket's send buffer full is dropped rather than waited
// for, so that no agent's unreachable address can hold up the answers of
// the others, which share the socket.

// Counters are what the server dropped without a record of its own.
type Counters struct {
	// UnknownSources counts UDP packets and TCP connections from
	// addresses no agent owns: dropped, never answered.
	UnknownSources uint64
	// Malformed counts UDP packets that are not a DNS message, or are a
	// response: dropped, never answered (an answer could be reflected).
	Malformed uint64
	// RepliesDropped counts replies the socket could not take at once.
	RepliesDropped uint64
}

// Counters returns what the server has dropped so far.
func (s *Server) Counters() Counters {
	return Counters{
		UnknownSources: s.unknownSources.Load(),
		Malformed:      s.malformed.Load(),
		RepliesDropped: s.repliesDropped.Load(),
	}
}

// udpReadSize bounds a query read over UDP: queries are small (a question
// and an OPT record); larger packets do not parse and are dropped.
const udpReadSize = 4096

// oobSize holds the control message that says which address a packet was
// sent to, IPv4 or IPv6.
var oobSize = max(len(ipv4.NewControlMessage(ipv4.FlagDst|ipv4.FlagInterface)), len(ipv6.NewControlMessage(ipv6.FlagDst|ipv6.FlagInterface)))

// packet is one query read off the socket, with what its answer needs.
type packet struct {
	buf []byte // the query, in a buffer from packets
	src netip.AddrPort
	oob []byte // where it was sent, to answer from there
}

var packets = sync.Pool{New: func() any { return &packet{buf: make([]byte, udpReadSize), oob: make([]byte, oobSize)} }}

// udpServer serves one packet connection.
type udpServer struct {
	s        *Server
	pc       net.PacketConn
	udp      *net.UDPConn // pc, when it is one: control messages, and sends that never wait
	sender   *sender      // nil when pc is not a UDP socket
	handlers sync.WaitGroup
	closed   atomic.Bool
	stopped  chan struct{} // closed when the read loop has returned
}

func newUDPServer(s *Server, pc net.PacketConn) *udpServer {
	u := &udpServer{s: s, pc: pc, stopped: make(chan struct{})}
	if udp, ok := pc.(*net.UDPConn); ok {
		u.udp = udp
		// Where each query was sent, so that the answer comes from there
		// on a socket bound to a wildcard address. One family is enough.
		err6 := ipv6.NewPacketConn(udp).SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true)
		err4 := ipv4.NewPacketConn(udp).SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true)
		if err4 != nil && err6 != nil {
			s.logger().Debug("dns: no destination control messages; answers leave from the routed address", "err", err4)
		}
		u.sender = newSender(udp)
	}
	return u
}

// run reads queries until the connection is closed.
func (u *udpServer) run(started func()) error {
	defer close(u.stopped)
	started()
	for {
		p := packets.Get().(*packet)
		n, oobn, src, err := u.read(p)
		if err != nil {
			packets.Put(p)
			if u.closed.Load() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		u.dispatch(p, n, oobn, src)
	}
}

func (u *udpServer) read(p *packet) (n, oobn int, src netip.AddrPort, err error) {
	p.buf, p.oob = p.buf[:cap(p.buf)], p.oob[:cap(p.oob)]
	if u.udp != nil {
		n, oobn, _, src, err = u.udp.ReadMsgUDPAddrPort(p.buf, p.oob)
		return n, oobn, src, err
	}
	var a net.Addr
	n, a, err = u.pc.ReadFrom(p.buf)
	if ua, ok := a.(*net.UDPAddr); ok {
		src = ua.AddrPort()
	}
	return n, 0, src, err
}

// dispatch identifies the packet's agent and hands the packet to a
// handler of its own, within the agent's share.
func (u *udpServer) dispatch(p *packet, n, oobn int, src netip.AddrPort) {
	s := u.s
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	seen := s.mem.seen()
	agent, pol, ok := s.identify(src.Addr())
	if !ok {
		s.unknownSources.Add(1)
		packets.Put(p)
		return
	}
	p.buf, p.oob, p.src = p.buf[:n], p.oob[:oobn], src
	bound := s.handling.Take(agent, 2*cmp(s.MaxInFlightPerAgent, DefaultMaxInFlightPerAgent), 2*cmp(s.MaxInFlight, DefaultMaxInFlight))
	if why := bound.Reason(ReasonAgentOverloaded, ReasonOverloaded); why != "" {
		// Answered here, on the read loop: a send that never waits.
		u.refuseBusy(p, agent, why)
		packets.Put(p)
		return
	}
	u.handlers.Add(1)
	go func() {
		defer u.handlers.Done()
		defer s.handling.Release(agent)
		defer packets.Put(p)
		u.handle(p, agent, pol, seen)
	}()
}

// handle answers one query, or drops it when it is not one; seen is the
// memory's count of Forgets before the agent was identified.
func (u *udpServer) handle(p *packet, agent string, pol *policy.Policy, seen uint64) {
	req := u.unpack(p)
	if req == nil {
		return
	}
	w := &udpReply{u: u, p: p}
	if rcode, ok := rejected(req); !ok {
		resp := new(dns.Msg)
		resp.SetRcode(req, rcode)
		w.WriteMsg(resp)
		return
	}
	u.s.serveQuery(w, req, p.src.Addr(), agent, pol, seen, true)
}

// unpack parses a query, or returns nil when there is none to answer: a
// response, or a packet without even a header, is dropped (an answer
// could be reflected), and a query whose body does not parse is answered
// FORMERR here.
func (u *udpServer) unpack(p *packet) *dns.Msg {
	req := new(dns.Msg)
	err := req.Unpack(p.buf)
	switch {
	case len(p.buf) < dnsHeaderSize || req.Response:
		u.s.malformed.Add(1)
		return nil
	case err != nil:
		u.s.malformed.Add(1)
		resp := new(dns.Msg)
		resp.SetRcodeFormatError(req)
		(&udpReply{u: u, p: p}).WriteMsg(resp)
		return nil
	}
	return req
}

// dnsHeaderSize is the fixed header of every DNS message.
const dnsHeaderSize = 12

// rejected says how to answer a message that is not a plain query (an
// opcode other than QUERY, or other than one question and nothing in
// the answer and authority sections), or ok for a query.
func rejected(req *dns.Msg) (rcode int, ok bool) {
	switch {
	case req.Opcode != dns.OpcodeQuery:
		return dns.RcodeNotImplemented, false
	case len(req.Question) != 1, len(req.Answer) != 0, len(req.Ns) != 0, len(req.Extra) > 1:
		return dns.RcodeFormatError, false
	}
	return 0, true
}

// refuseBusy answers SERVFAIL to a query of an agent with no place left
// among the queries being answered, and records it with the reason of
// the bound it met.
func (u *udpServer) refuseBusy(p *packet, agent, reason string) {
	req := u.unpack(p)
	if req == nil {
		return
	}
	resp := new(dns.Msg)
	resp.SetRcode(req, dns.RcodeServerFailure)
	(&udpReply{u: u, p: p}).WriteMsg(resp)
	rec := queryRecord(req)
	rec.Agent, rec.Reason, rec.Status = agent, reason, dns.RcodeServerFailure
	u.s.record(rec)
}

// shutdown stops reading and waits for the handlers until ctx is done.
// It is called only on a server whose read loop has started.
func (u *udpServer) shutdown(ctx context.Context) error {
	u.closed.Store(true)
	err := u.pc.Close()
	done := make(chan struct{})
	go func() {
		// The loop adds handlers: it has returned before they are
		// waited for.
		<-u.stopped
		u.handlers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// udpReply answers one UDP query; it implements dns.ResponseWriter.
type udpReply struct {
	u   *udpServer
	p   *packet
	out []byte
}

func (w *udpReply) LocalAddr() net.Addr  { return w.u.pc.LocalAddr() }
func (w *udpReply) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.p.src) }

func (w *udpReply) WriteMsg(m *dns.Msg) error {
	b, err := m.PackBuffer(w.out)
	if err != nil {
		return err
	}
	w.out = b
	_, err = w.Write(b)
	return err
}

// Write sends b at once, or drops it if the socket cannot take it now.
func (w *udpReply) Write(b []byte) (int, error) {
	u := w.u
	if u.sender == nil {
		return u.pc.WriteTo(b, net.UDPAddrFromAddrPort(w.p.src))
	}
	err := u.sender.send(b, answerFrom(w.p.oob), w.p.src)
	if errors.Is(err, errWouldBlock) {
		u.s.repliesDropped.Add(1)
	}
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

func (w *udpReply) Close() error        { return nil }
func (w *udpReply) TsigStatus() error   { return nil }
func (w *udpReply) TsigTimersOnly(bool) {}
func (w *udpReply) Hijack()             {}

// answerFrom is the control message that makes a reply leave from the
// address the query was sent to, or nil.
func answerFrom(oob []byte) []byte {
	if len(oob) == 0 {
		return nil
	}
	var dst net.IP
	var cm6 ipv6.ControlMessage
	var cm4 ipv4.ControlMessage
	switch {
	case cm6.Parse(oob) == nil && cm6.Dst != nil:
		dst = cm6.Dst // IPv4 too, mapped, on a dual-stack socket
	case cm4.Parse(oob) == nil && cm4.Dst != nil:
		dst = cm4.Dst
	default:
		return nil
	}
	if dst.To4() == nil {
		return (&ipv6.ControlMessage{Src: dst}).Marshal()
	}
	return (&ipv4.ControlMessage{Src: dst}).Marshal()
}

// errWouldBlock is a send the socket could not take without waiting.
var errWouldBlock = errors.New("dnsfilter: send buffer full")
