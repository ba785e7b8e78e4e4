package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/budget"
)

// relay is one allowed connection being moved: the client (whatever
// connection the listener yielded) and the upstream. The Proxy's
// KernelPath moves the bytes when it may; else, between two *net.TCPConn
// on Linux, the kernel splices them at the proxy's calls; otherwise
// copyTracked copies them, noting when bytes last moved.
type relay struct {
	client     net.Conn
	up         *net.TCPConn
	spliced    bool                   // both ends are TCP and the OS splices
	lastActive atomic.Int64           // unix nanoseconds of the last bytes copyTracked moved
	why        atomic.Pointer[string] // why it was cut short, if it was
	urgent     atomic.Bool            // urgent data passed: it stays off the kernel path
	// kernelSlot, if set, takes one of the agent's places on the kernel
	// path before a handover (Proxy.kernelSlot); none left keeps the
	// connection on the user-space relay.
	kernelSlot func() (release func(), ok bool)
	// paceUp and paceDown, when set, are told of the bytes moved each
	// way and wait while the agent is over its byte quota.
	paceUp, paceDown *pacer
	// kernelAbort, while the KernelPath moves the connection, ends it
	// there, its counts fixed before abort closes the sockets. handing
	// guards it, and is held while the KernelPath takes the connection
	// and while an abort ends it, so that neither comes in the midst of
	// the other.
	handing     sync.Mutex
	kernelAbort func()
}

func newRelay(client net.Conn, up *net.TCPConn) *relay {
	clientTCP, ok := client.(*net.TCPConn)
	if ok {
		urgentInline(clientTCP)
	}
	urgentInline(up)
	r := &relay{client: client, up: up, spliced: ok && canSplice}
	r.lastActive.Store(time.Now().UnixNano())
	return r
}

// pacer holds one direction of an agent's connections, all of them
// together, to a rate of bytes per second. A nil pacer does not limit.
type pacer struct {
	rates  *budget.Rates
	agent  string
	rate   float64
	closed <-chan struct{}
}

// pacer returns the pacer of agent's bytes in one direction, or nil for
// no limit.
func (p *Proxy) pacer(rates *budget.Rates, agent string, rate float64) *pacer {
	if rate <= 0 {
		return nil
	}
	return &pacer{rates: rates, agent: agent, rate: rate, closed: p.closedCh}
}

// chunk bounds the bytes a connection moves before it is charged: an
// eighth of a second's worth (at least 4 KiB), so that what the agent's
// many connections move ahead of paying stays small.
func (pc *pacer) chunk(n int) int {
	if pc == nil {
		return n
	}
	return min(n, max(int(pc.rate/8), 4<<10))
}

// moved charges n bytes to the agent and sleeps off its debt, whole (or
// until the proxy shuts down). The copy stops meanwhile, and TCP's window
// pushes back on the sender.
func (pc *pacer) moved(n int64) {
	if pc == nil || n <= 0 {
		return
	}
	d := pc.rates.Wait(pc.agent, float64(n), pc.rate, pc.rate, time.Now())
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-pc.closed:
	}
}

// read reads into p from r, at most a chunk, and charges what it read.
func (pc *pacer) read(r io.Reader, p []byte) (int, error) {
	n, err := r.Read(p[:pc.chunk(len(p))])
	pc.moved(int64(n))
	return n, err
}

// write writes b to w in chunks, each charged as it is written, so that
// a large write waits its turn in pieces.
func (pc *pacer) write(w io.Writer, b []byte) (int, error) {
	total := 0
	for len(b) > 0 {
		n, err := w.Write(b[:pc.chunk(len(b))])
		pc.moved(int64(n))
		total += n
		b = b[n:]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// abort ends both directions at once with a reset, so that a reset on one
// side surfaces as a reset on the other.
func (r *relay) abort(why string) {
	r.why.CompareAndSwap(nil, &why)
	// Under handing, whole: a handover waits for the sockets to be
	// closed (and Move refuses them), or has given its abort.
	r.handing.Lock()
	defer r.handing.Unlock()
	if r.kernelAbort != nil {
		r.kernelAbort()
	}
	reset(r.client)
	reset(r.up)
}

// copyBuffers are copyTracked's buffers.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyTracked copies through user space, recording when bytes last moved,
// for connections the kernel cannot splice, held to pace; it stops at
// src's end of stream or once it has copied limit bytes.
func (r *relay) copyTracked(dst, src net.Conn, pace *pacer, limit int64) (int64, error) {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	var total int64
	for total < limit {
		n, rerr := src.Read((*bp)[:min(int64(pace.chunk(len(*bp))), limit-total)])
		if n > 0 {
			r.lastActive.Store(time.Now().UnixNano())
			m, werr := dst.Write((*bp)[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
			pace.moved(int64(m))
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
	return total, nil
}

// sinceActive is how long ago copyTracked last moved bytes.
func (r *relay) sinceActive() time.Duration {
	return time.Since(time.Unix(0, r.lastActive.Load()))
}

// relay writes what each side sent before the decision to the other, then
// moves both directions until both are done, and records the connection.
// It clears a's first bytes once they are written, so that no frame
// below an open connection keeps their buffer. Its own frame is kept
// small (the record is built and finished in calls of their own): an open
// connection's goroutine waits beneath it, and a shallow stack is one the
// garbage collector can shrink.
func (s *session) relay(a *allowed) {
	rec, conn, ok := s.beginRelay(a)
	if !ok {
		return
	}
	r := newRelay(s.client, a.up)
	if s.p.KernelPath != nil {
		r.kernelSlot = func() (func(), bool) { return s.p.kernelSlot(s.agent) }
	}
	q := s.pol.Quotas()
	r.paceUp = s.p.pacer(&s.p.bytesUp, s.agent, q.BytesPerSecondUp)
	r.paceDown = s.p.pacer(&s.p.bytesDown, s.agent, q.BytesPerSecondDown)
	s.p.relays.add(r)
	defer s.p.relays.remove(r)
	if s.tracked != nil {
		done, refused := s.tracked.moving(r.abort, func() string { return rejudgeSpliced(s.current(), a.target, rec.Addr) })
		defer done()
		if refused { // by a policy or a Forget that came while it was judged: no rule allows it now
			rec.Allowed, rec.Rule = false, ""
		}
	}

	var err error
	if rec.BytesUp, err = writeAll(a.up, a.clientBytes); err != nil {
		r.abort(fmt.Sprintf("%s: %v", directionNames[0], err))
	} else if rec.BytesDown, err = writeAll(s.client, a.upBytes); err != nil {
		r.abort(fmt.Sprintf("%s: %v", directionNames[1], err))
	} else {
		a.clientBytes, a.upBytes = nil, nil // counted, and let go of
		var n, m int64
		n, m, rec.Relay, err = r.run(s.p.KernelPath, s.p.kernelPathAfter(), s.p.logger)
		rec.BytesUp, rec.BytesDown = rec.BytesUp+n, rec.BytesDown+m
	}
	s.endRelay(r, rec, conn, a.target.decision.Reason, err)
}

// beginRelay records a's connection as open, unless it is to a host
// whose requests the policy judges: every spliced path passes here, so
// bytes the gateway does not read never go to such a host.
func (s *session) beginRelay(a *allowed) (*egresslog.Record, *egresslog.Conn, bool) {
	if a.target.decision.Requests {
		a.up.Close()
		s.deny(a.target, a.target.decision, ReasonRequestsUnseen)
		return nil, nil, false
	}
	rec := new(egresslog.Record)
	*rec = s.baseRecord(a.kind, a.target, a.target.decision)
	rec.Addr = addrPortOf(a.up.RemoteAddr())
	var conn *egresslog.Conn
	if s.p.Log != nil {
		conn = s.p.Log.Begin(*rec)
	}
	return rec, conn, true
}

// endRelay records the end of r's connection, err its failure if any,
// and closes both sides. allowedWhy is the decision's reason, which a
// clean end keeps.
func (s *session) endRelay(r *relay, rec *egresslog.Record, conn *egresslog.Conn, allowedWhy string, err error) {
	rec.Reason = ReasonClosed
	if why := r.why.Load(); why != nil {
		rec.Reason = *why
	} else if err != nil {
		rec.Reason = err.Error()
	}
	if rec.Reason == ReasonClosed && allowedWhy != "" {
		rec.Reason = allowedWhy
	}
	rec.Duration = time.Since(s.start)
	rec.Reason = s.notes.Annotate(rec.Reason)
	if conn != nil {
		conn.End(*rec)
	}
	r.client.Close()
	r.up.Close()
}

// writeAll writes b to c and says how many of its bytes went.
func writeAll(c net.Conn, b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, err := c.Write(b)
	return int64(n), err
}

// run moves both ways until both are done, and says how
// (egresslog.RelayKernel, RelaySplice or RelayCopy). It relays in user
// space first: the client's bytes to the upstream in a new goroutine, the
// upstream's to the client in this one; an end of stream in one direction
// is passed on as a half-close, and an error in either aborts both with a
// reset. A connection nothing of which needs the proxy (both ends TCP,
// no byte quota to hold it to) is handed to the kernel path, if there is
// one, once either direction has moved after bytes (at once if after is
// negative) while neither has ended: a connection done before then never
// pays for the move.
func (r *relay) run(kernel KernelPath, after int, logger func() *slog.Logger) (up, down int64, how string, err error) {
	how = egresslog.RelayCopy
	if r.spliced {
		how = egresslog.RelaySplice
	}
	var h *handover
	if kernel != nil && r.spliced && r.paceUp == nil && r.paceDown == nil {
		h = r.handover(int64(after))
	}
	var n [2]int64 // client->upstream, upstream->client
	which := [2]bool{true, true}
	for attempt := 1; which != [2]bool{}; attempt++ {
		stops, merr := r.moveBoth(h, which, &n)
		err = errors.Join(err, merr)
		which = [2]bool{stops[0] != running, stops[1] != running}
		if which == [2]bool{} {
			break
		}
		r.client.SetReadDeadline(time.Time{})
		r.up.SetReadDeadline(time.Time{})
		switch {
		case r.urgent.Load():
			h = nil // the kernel path would pass urgent data on inline
		case stops == [2]stop{emptied, emptied}:
			release, ok := func() {}, true
			if r.kernelSlot != nil {
				release, ok = r.kernelSlot()
			}
			if !ok {
				h = nil // the agent's places on the kernel path are taken
				break
			}
			wait, kerr := r.handOver(kernel)
			if kerr == nil {
				up, down, err = wait()
				r.leaveKernel()
				release()
				if err != nil {
					r.abort(kernelFailure(err))
				}
				return n[0] + up, n[1] + down, egresslog.RelayKernel, err
			}
			release()
			logger().Debug("kernel path refused a connection; relaying it", "err", kerr)
			h = nil
		case which == [2]bool{true, true} && attempt < handoverAttempts:
			// A sender kept its queue full: try again further on.
			h = r.handover(max(h.after, DefaultKernelPathAfter) << 1)
		default:
			h = nil // relayed to the end
		}
	}
	return n[0], n[1], how, err
}

// handOver offers the connection to the kernel path, as Move does. An
// abort that comes meanwhile waits for Move's answer, so that it ends a
// connection the kernel path took through the kernel path's abort, its
// counts fixed while both sockets are open. One that came before has
// closed the sockets by then: Move refuses them.
func (r *relay) handOver(kernel KernelPath) (wait func() (up, down int64, err error), err error) {
	r.handing.Lock()
	defer r.handing.Unlock()
	wait, stop, err := kernel.Move(r.client.(*net.TCPConn), r.up)
	if err == nil {
		r.kernelAbort = stop
	}
	return wait, err
}

// leaveKernel forgets the kernel path's abort once its wait has
// returned: the pair is gone.
func (r *relay) leaveKernel() {
	r.handing.Lock()
	defer r.handing.Unlock()
	r.kernelAbort = nil
}

// kernelFailure is why a connection failed on the kernel path, said as
// the user-space relay says it: by the direction whose source failed,
// when the error says which socket that was.
func kernelFailure(err error) string {
	var side interface {
		FailedSide() int
		Unwrap() error
	}
	if errors.As(err, &side) && side.FailedSide() >= 0 && side.FailedSide() < len(directionNames) {
		return fmt.Sprintf("%s: %v", directionNames[side.FailedSide()], side.Unwrap())
	}
	return err.Error()
}

// directionNames name a relay's directions by their source: the client's
// bytes, then the upstream's.
var directionNames = [2]string{"client->upstream", "upstream->client"}

// handoverAttempts bounds the times a relay tries to hand a connection
// over whose senders keep the receive queues full (bulk on loopback),
// each after twice the bytes of the one before.
const handoverAttempts = 6

// handover is a handover of r to the kernel path after bytes.
func (r *relay) handover(after int64) *handover {
	return &handover{after: after, asked: after < 0, srcs: [2]net.Conn{r.client, r.up}}
}

// stop is where a direction of a relay stopped.
type stop int

const (
	running stop = iota // at its end of stream, or failed: done
	emptied             // for a handover, with its receive queue empty
	full                // for a handover, its sender keeping the queue full
)

// handover stops both directions of a relay once either has moved after
// bytes, so that the kernel path can take the connection: each settles
// (see settle), and the connection is handed over once both have. A
// connection with a direction already ended is not handed over (a
// half-closed socket cannot join the kernel path); its other direction
// goes on.
type handover struct {
	after int64
	srcs  [2]net.Conn // each direction's source: a read deadline in the past stops its wait

	mu      sync.Mutex
	asked   bool
	ended   [2]bool
	waiting [2]bool // settled, and waiting for the other direction
	outcome outcome
}

// outcome is how a handover attempt ends.
type outcome int

const (
	pending   outcome = iota
	handed            // both directions settled at once
	abandoned         // a direction ended, failed, or kept its queue full
)

// interrupt stops direction i's wait for bytes.
func (h *handover) interrupt(i int) { h.srcs[i].SetReadDeadline(time.Unix(1, 0)) }

// ask, from direction i, which has moved its after bytes, stops both
// directions, unless the other has ended; true if the relay is being
// handed over. A direction that goes on, its other ended, takes back the
// stop the other's ask put on its source, if it came before the end:
// its copy would fail on it at once.
func (h *handover) ask(i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended[1-i] {
		if h.asked {
			h.srcs[i].SetReadDeadline(time.Time{})
		}
		return false
	}
	if !h.asked {
		h.asked = true
		h.interrupt(0)
		h.interrupt(1)
	}
	return true
}

// arrive says that direction i has settled, its receive queue empty: if
// the other waits settled, the relay is handed over, and the other's wait
// ends; else i waits, its own wait for bytes made possible again. It
// returns the outcome so far.
func (h *handover) arrive(i int) outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.outcome == pending {
		if h.waiting[1-i] {
			h.outcome = handed
			h.interrupt(1 - i)
		} else {
			h.waiting[i] = true
			h.srcs[i].SetReadDeadline(time.Time{})
		}
	}
	return h.outcome
}

// depart ends direction i's wait, and returns the outcome so far.
func (h *handover) depart(i int) outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting[i] = false
	return h.outcome
}

// abandon gives the attempt up, ending a settled direction's wait.
func (h *handover) abandon() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.abandonLocked()
}

func (h *handover) abandonLocked() {
	if h.outcome != pending {
		return
	}
	h.outcome = abandoned
	for i, w := range h.waiting {
		if w {
			h.interrupt(i)
		}
	}
}

// stopping says whether the directions are being stopped, to hand over.
func (h *handover) stopping() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.asked
}

// end notes that direction i has ended, which abandons an attempt.
func (h *handover) end(i int) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended[i] = true
	h.abandonLocked()
}

// direction is one way of a relay: from src to dst, held to pace, named
// in a failure's reason.
type direction struct {
	dst, src net.Conn
	pace     *pacer
	name     string
}

func (r *relay) directions() [2]direction {
	return [2]direction{
		{dst: r.up, src: r.client, pace: r.paceUp, name: directionNames[0]},
		{dst: r.client, src: r.up, pace: r.paceDown, name: directionNames[1]},
	}
}

// moveBoth moves the directions which says, adding their bytes to n:
// direction 0 in a new goroutine when both move, the other in this one.
// With a handover, a direction may stop before its end; stops says
// where each did.
func (r *relay) moveBoth(h *handover, which [2]bool, n *[2]int64) (stops [2]stop, err error) {
	ds := r.directions()
	var errs [2]error
	var wg sync.WaitGroup
	for i := range 2 {
		if !which[i] {
			continue
		}
		move := func() {
			var m int64
			m, stops[i], errs[i] = r.move(ds[i], i, h)
			n[i] += m
		}
		if i == 0 && which[1] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				move()
			}()
		} else {
			move()
		}
	}
	wg.Wait()
	return stops, errors.Join(errs[0], errs[1])
}

// move copies direction i of the relay to its end of stream, which it
// passes on as a half-close; a failure aborts both directions. With a
// handover it stops once it or the other direction has moved h.after
// bytes, unless one of them has ended, and settles.
func (r *relay) move(d direction, i int, h *handover) (n int64, at stop, err error) {
	limit := int64(noLimit)
	if h != nil {
		limit = h.after
	}
	stopping := h.stopping()
	if !stopping {
		n, err = r.copy(d.dst, d.src, d.pace, limit)
		switch {
		case err == nil && n >= limit:
			if stopping = h.ask(i); !stopping {
				var m int64
				m, err = r.copy(d.dst, d.src, d.pace, noLimit)
				n += m
			}
		case errors.Is(err, os.ErrDeadlineExceeded) && h.stopping():
			stopping, err = true, nil
		}
	}
	if stopping {
		var m int64
		var ended bool
		m, at, ended, err = r.settle(d, i, h)
		n += m
		if err == nil && !ended {
			return n, at, nil
		}
	}
	if err != nil {
		r.abort(d.name + ": " + err.Error())
		return n, running, fmt.Errorf("%s: %w", d.name, err)
	}
	h.end(i)
	closeWrite(d.dst)
	return n, running, nil
}

// settle passes on what direction i's source has received, without
// waiting for more, until its receive queue is empty (the kernel path is
// handed whole skbs, and one the relay read part of would go again), and
// arrives at the handover. While the other direction has not settled, it
// keeps moving whatever arrives: a direction that stopped reading while
// the other still moved bytes would stall a peer that reads only once
// its own writes go through (a mirror), and with it the other direction,
// until the idle timeout. It stops at emptied once both have settled, or
// the attempt is abandoned (by the other direction, or by this one: at
// its end of stream, a failure, or after flushBound bytes, at full; or
// at full too, if bytes it was woken for would not flush, rather than
// wake for them again and again).
func (r *relay) settle(d direction, i int, h *handover) (n int64, at stop, ended bool, err error) {
	for woken := false; ; woken = true {
		var m int64
		m, at, ended, err = r.flush(d.dst, d.src, flushBound-n)
		n += m
		if err != nil || ended || at == full || (woken && m == 0) {
			h.abandon()
			if err == nil && !ended {
				at = full
			}
			return n, at, ended, err
		}
		if h.arrive(i) != pending {
			return n, emptied, false, nil
		}
		_, err = awaitBytes(d.src) // its end, or an error, the next flush meets
		if h.depart(i) != pending {
			return n, emptied, false, nil
		}
		if err != nil {
			h.abandon() // not woken by the handover: the connection failed
			return n, running, false, err
		}
	}
}

// flushBound is the most a handover's flushes of one direction move
// looking for an empty receive queue: a sender that keeps it full stays
// on the relay.
const flushBound = 4 << 20

// noLimit is a copy's limit that only its end of stream reaches.
const noLimit = math.MaxInt64

// closeWrite half-closes c if it can; otherwise the end of stream is
// passed on when the connection closes.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// mover is what moves a connection's bytes, as the idle sweep and a
// forced shutdown find it: a relay, a plain HTTP request being forwarded
// (an upgrade's tunnel too), or an intercepted connection.
type mover interface {
	idle() time.Duration
	abort(why string)
}

// relaySet is the set of open movers, swept for idleness.
type relaySet struct {
	mu sync.Mutex
	m  map[mover]struct{}
}

func (rs *relaySet) add(r mover) {
	rs.mu.Lock()
	rs.m[r] = struct{}{}
	rs.mu.Unlock()
}

func (rs *relaySet) remove(r mover) {
	rs.mu.Lock()
	delete(rs.m, r)
	rs.mu.Unlock()
}

func (rs *relaySet) snapshot() []mover {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]mover, 0, len(rs.m))
	for r := range rs.m {
		out = append(out, r)
	}
	return out
}

func (rs *relaySet) closeAll() {
	for _, r := range rs.snapshot() {
		r.abort(ReasonShuttingDown)
	}
}

// startSweeper starts, once, the goroutine that closes idle relays.
func (p *Proxy) startSweeper() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sweeperActive {
		return
	}
	p.sweeperActive = true
	idle := orDefault(p.IdleTimeout, DefaultIdleTimeout)
	every := min(max(idle/4, 10*time.Millisecond), 30*time.Second)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.closedCh:
				return
			case <-t.C:
				for _, r := range p.relays.snapshot() {
					if r.idle() >= idle {
						r.abort(ReasonIdle)
					}
				}
			}
		}
	}()
}

// prefixConn is a client connection whose first reads replay bytes the
// proxy already read; it counts bytes each way, and when they last moved.
// It wraps rather than embeds the connection, so that no promoted
// ReadFrom or WriteTo can skip the replayed bytes or the counts.
type prefixConn struct {
	c          net.Conn
	prefix     *bytes.Reader
	read       atomic.Int64
	written    atomic.Int64
	lastActive atomic.Int64 // Unix nanoseconds
	closed     chan struct{}
	once       sync.Once
	// paceUp and paceDown hold the agent to its byte quotas, as a relay's.
	paceUp, paceDown *pacer
}

var _ net.Conn = (*prefixConn)(nil)

func newPrefixConn(c net.Conn, prefix []byte) *prefixConn {
	pc := &prefixConn{c: c, prefix: bytes.NewReader(prefix), closed: make(chan struct{})}
	pc.lastActive.Store(time.Now().UnixNano())
	return pc
}

// idle is how long ago bytes last moved either way.
func (c *prefixConn) idle() time.Duration {
	return time.Since(time.Unix(0, c.lastActive.Load()))
}

func (c *prefixConn) Read(b []byte) (int, error) {
	var src io.Reader = c.c
	if c.prefix.Len() > 0 {
		src = c.prefix
	}
	n, err := c.paceUp.read(src, b)
	if n > 0 {
		c.lastActive.Store(time.Now().UnixNano())
	}
	c.read.Add(int64(n))
	return n, err
}

// Write writes b, in chunks its pacer allows.
func (c *prefixConn) Write(b []byte) (int, error) {
	n, err := c.paceDown.write(c.c, b)
	if n > 0 {
		c.lastActive.Store(time.Now().UnixNano())
	}
	c.written.Add(int64(n))
	return n, err
}

// Close closes the connection and signals whoever waits for it.
func (c *prefixConn) Close() error {
	err := c.c.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// CloseWrite half-closes the connection, if it can be.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *prefixConn) LocalAddr() net.Addr                { return c.c.LocalAddr() }
func (c *prefixConn) RemoteAddr() net.Addr               { return c.c.RemoteAddr() }
func (c *prefixConn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *prefixConn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *prefixConn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }
