//go:build linux

package fastpath

import (
	"errors"
	"fmt"
	"net"
	"sync"
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
// error on either side (a reset) ends both at once. The sockets stay
// open: the caller closes them (after Remove).
//
// Nothing is polled while bytes move: each side's end is a read of its
// socket returning, which the kernel path leaves to user space. Only at
// an end does Run wait, briefly, for the last bytes to be queued.
func (pr *Pair) Run(a, b *net.TCPConn) (aToB, bToA int64, err error) {
	conns := [2]*net.TCPConn{a, b}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pr.waitEnd(i, conns)
			if errs[i] != nil {
				for _, c := range conns {
					c.SetLinger(0)
					c.SetReadDeadline(time.Now()) // the other side's wait returns
				}
			}
		}()
	}
	wg.Wait()
	aToB, bToA = pr.Bytes()
	return aToB, bToA, errors.Join(errs...)
}

// waitEnd waits for side i's end of stream and passes it on. The
// socket is never read: the verdict takes every byte it receives, and
// its state says when the other end finished (or reset), which the
// kernel signals to the poller as it changes.
func (pr *Pair) waitEnd(i int, conns [2]*net.TCPConn) error {
	src, dst := conns[i], conns[1-i]
	rc, err := src.SyscallConn()
	if err != nil {
		return fmt.Errorf("fastpath: %w", err)
	}
	var sockErr error
	err = rc.Read(func(fd uintptr) bool {
		if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			sockErr = errors.Join(err, syscall.Errno(e))
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
	moved := pr.moved(i)
	deadline := time.Now().Add(drainTimeout)
	for {
		q, err := queued(dst)
		if err != nil || q-pr.base[1-i] >= moved || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return dst.CloseWrite()
}

// moved is what the kernel path redirected from side i.
func (pr *Pair) moved(i int) int64 {
	a, b := pr.Bytes()
	if i == 0 {
		return a
	}
	return b
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
