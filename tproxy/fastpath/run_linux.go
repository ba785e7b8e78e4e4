//go:build linux

package fastpath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drainTimeout bounds the wait for a side's bytes to leave the kernel
// path before its end of stream is passed on.
var drainTimeout = 5 * time.Second

// Run waits until both directions of the pair have ended, passing each
// end of stream on as a half-close once every byte before it has been
// queued on the other side, and returns the bytes moved each way. An
// error on either side (a reset) ends both at once, and is the one Run
// returns. The sockets stay open: the caller closes them (after Remove).
//
// Nothing is polled while bytes move: each side's end is a change of its
// socket's state, which wakes the poller. Only at an end does Run wait,
// briefly, for the last bytes to be queued. It waits for b in a new
// goroutine and for a in the caller's, as a relay copies.
func (pr *Pair) Run(a, b *net.TCPConn) (aToB, bToA int64, err error) {
	conns := [2]*net.TCPConn{a, b}
	var first atomic.Pointer[error] // the cause; the other side's error follows from it
	wait := func(i int) {
		if err := pr.waitEnd(i, conns); err != nil && first.CompareAndSwap(nil, &err) {
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
	if e := first.Load(); e != nil {
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
	pr.drain(i, dst)
	if left {
		if err := pr.relayRest(i, dst, src); err != nil {
			return fmt.Errorf("fastpath: %w", err)
		}
	}
	return dst.CloseWrite()
}

// drain waits, up to drainTimeout, until dst has taken to send every
// byte the verdict redirected from side i.
func (pr *Pair) drain(i int, dst *net.TCPConn) {
	moved := pr.moved(i)
	deadline := time.Now().Add(drainTimeout)
	for {
		q, err := queued(dst)
		if err != nil || q-pr.base[1-i] >= moved || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
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

// queued is how many bytes c's sending side has taken so far: acknowledged,
// and still in its send queue.
func queued(c *net.TCPConn) (int64, error) {
	var n int64
	err := withFD(c, func(fd int) error {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return err
		}
		outq, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		if err != nil {
			return err
		}
		n = int64(info.Bytes_acked) + int64(outq)
		return nil
	})
	return n, err
}
