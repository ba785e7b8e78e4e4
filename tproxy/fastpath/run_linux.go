//go:build linux

package fastpath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Run waits until both directions of the pair have ended, passing each
// end of stream on as a half-close once every byte before it has been
// queued on the other side (however long the other side's receiver
// takes: an end passed on ahead of bytes still queued would cut the
// stream short), and returns the bytes moved each way. An
// error on either side (a reset) ends both at once, and is the one Run
// returns. The sockets stay open: the caller closes them (after Remove).
//
// Nothing is polled while bytes move: each side's end is a change of its
// socket's state, which wakes the poller. Only at an end does Run wait
// for the last bytes to be queued, asking less and less often. It waits for b in a new
// goroutine and for a in the caller's, as a relay copies.
func (pr *Pair) Run(a, b *net.TCPConn) (aToB, bToA int64, err error) {
	conns := [2]*net.TCPConn{a, b}
	wait := func(i int) {
		if err := pr.waitEnd(i, conns); err != nil && pr.failed.CompareAndSwap(nil, &err) {
			for _, c := range conns {
				c.SetLinger(0)
				c.SetReadDeadline(time.Now()) // the other side's wait returns
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait(1)
	}()
	wait(0)
	<-done
	aToB, bToA = pr.Bytes()
	if e := pr.failed.Load(); e != nil {
		err = *e
	}
	return aToB, bToA, err
}

// waitEnd waits for side i's end of stream and passes it on. The
// socket is read only if the verdict leaves it bytes, once its peer fell
// MaxQueued behind: the direction is then relayed here to its end. Its
// state says when the other end finished (or reset), which the kernel
// signals to the poller as it changes.
func (pr *Pair) waitEnd(i int, conns [2]*net.TCPConn) error {
	src, dst := conns[i], conns[1-i]
	rc, err := src.SyscallConn()
	if err != nil {
		return fmt.Errorf("fastpath: %w", err)
	}
	var sockErr error
	var left bool // bytes wait for user space
	var probe [1]byte
	err = rc.Read(func(fd uintptr) bool {
		if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			sockErr = errors.Join(err, syscall.Errno(e))
			return true
		}
		if n, _, _ := unix.Recvfrom(int(fd), probe[:], unix.MSG_PEEK|unix.MSG_DONTWAIT); n > 0 {
			left = true
			return true
		}
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			sockErr = err
			return true
		}
		// Established, or ended only on this side: the other end may
		// still send. Any other state is after its end (a socket whose
		// both ends are done is closed, its time-wait kept apart); a
		// reset shows as SO_ERROR.
		switch info.State {
		case unix.BPF_TCP_ESTABLISHED, unix.BPF_TCP_FIN_WAIT1, unix.BPF_TCP_FIN_WAIT2:
			return false
		}
		return true
	})
	if err == nil {
		err = sockErr
	}
	if err != nil {
		return fmt.Errorf("fastpath: %w", err)
	}
	if err := pr.drain(i, dst); err != nil {
		return fmt.Errorf("fastpath: %w", err)
	}
	if left {
		if err := pr.relayRest(i, dst, src); err != nil {
			return fmt.Errorf("fastpath: %w", err)
		}
	}
	// Its failure is not the connection's, as a relay's half-close is
	// not: a peer already gone (ENOTCONN) has nothing left to be told.
	dst.CloseWrite()
	return nil
}

// drain waits until dst has taken to send every byte the verdict
// redirected from side i, asking after 1 ms, then less often, up to every
// 50 ms: a receiver that never takes them holds the connection until it
// is closed (the idle timeout, say), as it would hold a relay's write.
// It stops when dst's connection is gone (reset by its peer, which has
// left: its bytes go with it, as a relay's written into a socket whose
// peer resets go) or the other direction failed.
func (pr *Pair) drain(i int, dst *net.TCPConn) error {
	moved := pr.moved(i)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		q, closed, err := queued(dst)
		switch {
		case err != nil:
			return err
		case q-pr.base[1-i] >= moved:
			return nil
		case closed:
			return nil
		case pr.failed.Load() != nil:
			return errors.New("the other direction failed")
		}
		time.Sleep(wait)
	}
}

// relayBuffers are relayRest's.
var relayBuffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// relayRest copies side i's bytes to dst until its end of stream, for a
// direction the verdict left to user space. It reads with recvmsg (what
// the verdict left is queued for it alone; splicing would not see it).
func (pr *Pair) relayRest(i int, dst, src *net.TCPConn) error {
	bp := relayBuffers.Get().(*[]byte)
	defer relayBuffers.Put(bp)
	for {
		n, err := src.Read(*bp)
		if n > 0 {
			if _, werr := dst.Write((*bp)[:n]); werr != nil {
				return werr
			}
			pr.relayed[i].Add(int64(n))
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// moved is what the kernel path redirected from side i.
func (pr *Pair) moved(i int) int64 {
	return pr.redirected()[i]
}

// queued is how many bytes c's sending side has taken so far
// (acknowledged, and still in its send queue), and whether its
// connection is gone (closed, or reset).
func queued(c *net.TCPConn) (n int64, closed bool, err error) {
	err = withFD(c, func(fd int) error {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return err
		}
		outq, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		if err != nil {
			return err
		}
		n = int64(info.Bytes_acked) + int64(outq)
		closed = info.State == unix.BPF_TCP_CLOSE
		return nil
	})
	return n, closed, err
}
