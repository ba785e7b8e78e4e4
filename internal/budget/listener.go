package budget

import (
	"net"
	"net/netip"
	"sync"
)

// Listener bounds the connections it has accepted that are still open,
// per source address and in total: a connection beyond either bound is
// closed as soon as it is accepted, and Accept waits for the next.
type Listener struct {
	net.Listener
	PerSource, Total int // zero or less: no bound
	open             Counter
}

// Accept returns the next connection within the bounds; closing it
// counts it out.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := sourceOf(c.RemoteAddr())
		if !l.open.Acquire(src, l.PerSource, l.Total) {
			c.Close()
			continue
		}
		return &countedConn{Conn: c, release: func() { l.open.Release(src) }}, nil
	}
}

func sourceOf(a net.Addr) string {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap().String()
	}
	return a.String()
}

// countedConn counts itself out of its Listener's bounds when closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
