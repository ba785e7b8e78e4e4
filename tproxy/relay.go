package tproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agenthold/egress/egresslog"
)

// relay is one spliced connection: the client and the upstream, both
// *net.TCPConn, between which spliceCopy moves bytes in the kernel.
type relay struct {
	client, up *net.TCPConn
	why        atomic.Pointer[string] // why it was cut short, if it was
}

// abort ends both directions at once with a reset, so that a reset on one
// side surfaces as a reset on the other.
func (r *relay) abort(why string) {
	r.why.CompareAndSwap(nil, &why)
	r.client.SetLinger(0)
	r.up.SetLinger(0)
	r.client.Close()
	r.up.Close()
}

// relay writes what each side sent before the decision to the other, then
// splices both directions until both are done, and records the connection.
func (s *session) relay(kind egresslog.Kind, up *net.TCPConn, t target, clientBytes, upBytes []byte) {
	rec := s.baseRecord(kind, t, t.decision)
	rec.Addr = addrPortOf(up.RemoteAddr())
	var conn *egresslog.Conn
	if s.p.Log != nil {
		conn = s.p.Log.Begin(rec)
	}
	r := &relay{client: s.client, up: up}
	s.p.relays.add(r)
	defer s.p.relays.remove(r)

	var upN, downN int64
	var err error
	if err = writeAll(up, clientBytes); err != nil {
		r.abort(fmt.Sprintf("client->upstream: %v", err))
	} else if err = writeAll(s.client, upBytes); err != nil {
		r.abort(fmt.Sprintf("upstream->client: %v", err))
	} else {
		upN, downN, err = r.run()
	}
	rec.BytesUp = upN + int64(len(clientBytes))
	rec.Bytes = downN + int64(len(upBytes))
	rec.Reason = ReasonClosed
	if why := r.why.Load(); why != nil {
		rec.Reason = *why
	} else if err != nil {
		rec.Reason = err.Error()
	}
	if rec.Reason == ReasonClosed && t.decision.Reason != "" {
		rec.Reason = t.decision.Reason
	}
	rec.Duration = time.Since(s.start)
	if conn != nil {
		conn.End(rec)
	}
	r.client.Close()
	r.up.Close()
}

func writeAll(c *net.TCPConn, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := c.Write(b)
	return err
}

// run copies both ways: the client's bytes to the upstream in a new
// goroutine, the upstream's to the client in this one. An end of stream in
// one direction is passed on as a half-close; an error in either aborts
// both with a reset.
func (r *relay) run() (up, down int64, err error) {
	var wg sync.WaitGroup
	var upErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		up, upErr = copyClientToUpstream(r)
	}()
	down, downErr := copyUpstreamToClient(r)
	wg.Wait()
	return up, down, errors.Join(upErr, downErr)
}

func copyClientToUpstream(r *relay) (int64, error) {
	n, err := spliceCopy(r.up, r.client)
	if err != nil {
		r.abort("client->upstream: " + err.Error())
		return n, fmt.Errorf("client->upstream: %w", err)
	}
	r.up.CloseWrite()
	return n, nil
}

func copyUpstreamToClient(r *relay) (int64, error) {
	n, err := spliceCopy(r.client, r.up)
	if err != nil {
		r.abort("upstream->client: " + err.Error())
		return n, fmt.Errorf("upstream->client: %w", err)
	}
	r.client.CloseWrite()
	return n, nil
}

// relaySet is the set of open relays, swept for idleness.
type relaySet struct {
	mu sync.Mutex
	m  map[*relay]struct{}
}

func (rs *relaySet) add(r *relay) {
	rs.mu.Lock()
	rs.m[r] = struct{}{}
	rs.mu.Unlock()
}

func (rs *relaySet) remove(r *relay) {
	rs.mu.Lock()
	delete(rs.m, r)
	rs.mu.Unlock()
}

func (rs *relaySet) snapshot() []*relay {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]*relay, 0, len(rs.m))
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
// Spliced bytes never pass through user space, so idleness is read from
// the kernel: TCP_INFO's time since data was last received, on both
// sockets.
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
					if idleFor(r.client) >= idle && idleFor(r.up) >= idle {
						r.abort(ReasonIdle)
					}
				}
			}
		}
	}()
}

// idleFor returns how long ago c last received data, or 0 if unknown.
func idleFor(c *net.TCPConn) time.Duration {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var d time.Duration
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			d = time.Duration(info.Last_data_recv) * time.Millisecond
		}
	})
	return d
}

// prefixConn is a client connection whose first reads replay bytes the
// proxy already read; it counts bytes each way. It wraps rather than
// embeds the *net.TCPConn, so that no promoted ReadFrom or WriteTo can
// skip the replayed bytes or the counts.
type prefixConn struct {
	c       *net.TCPConn
	prefix  *bytes.Reader
	read    atomic.Int64
	written atomic.Int64
	closed  chan struct{}
	once    sync.Once
}

var _ net.Conn = (*prefixConn)(nil)

func newPrefixConn(c *net.TCPConn, prefix []byte) *prefixConn {
	return &prefixConn{c: c, prefix: bytes.NewReader(prefix), closed: make(chan struct{})}
}

func (c *prefixConn) Read(b []byte) (int, error) {
	var n int
	var err error
	if c.prefix.Len() > 0 {
		n, err = c.prefix.Read(b)
	} else {
		n, err = c.c.Read(b)
	}
	c.read.Add(int64(n))
	return n, err
}

func (c *prefixConn) Write(b []byte) (int, error) {
	n, err := c.c.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// Close closes the connection and signals whoever waits for it.
func (c *prefixConn) Close() error {
	err := c.c.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// CloseWrite half-closes the connection.
func (c *prefixConn) CloseWrite() error                  { return c.c.CloseWrite() }
func (c *prefixConn) LocalAddr() net.Addr                { return c.c.LocalAddr() }
func (c *prefixConn) RemoteAddr() net.Addr               { return c.c.RemoteAddr() }
func (c *prefixConn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *prefixConn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *prefixConn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }
