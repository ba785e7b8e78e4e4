//go:build linux

package fastpath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Run waits until both directions of the pair have ended, passing each
// end of stream on as a half-close once every byte before it has been
// queued on the other side (however long the other side's receiver
// takes: an end passed on ahead of bytes still queued would cut the
// stream short), and returns the bytes moved each way. An error on
// either side (a reset) ends both at once, and is the one Run returns.
// The sockets stay open: the caller closes them (after Remove); closing
// them ends Run.
//
// Nothing is polled while bytes move: each side's end is a change of its
// socket's state, which wakes the waiter. Run waits in the caller's
// goroutine alone, for a through Go's poller (which a Close wakes too)
// and for b through the Path's watcher, which interrupts that wait: an
// idle pair holds no goroutine of its own. Each end is passed on in a
// goroutine of its own, the last bytes awaited less and less often, as
// is a direction the verdict left to user space.
func (pr *Pair) Run(a, b *net.TCPConn) (aToB, bToA int64, err error) {
	conns := [2]*net.TCPConn{a, b}
	var mu sync.Mutex
	waitOnA := true // else a is relayed in user space, and Run waits on woken
	removeWatch, err := pr.p.watch.add(b, func() {
		pr.wake()
		mu.Lock()
		if waitOnA {
			a.SetReadDeadline(time.Unix(1, 0))
		}
		mu.Unlock()
	})
	if err != nil {
		pr.fail(conns, err)
		return 0, 0, err
	}
	defer removeWatch()
	rc, err := a.SyscallConn()
	if err != nil {
		pr.fail(conns, err)
		return 0, 0, err
	}
	var ended [2]bool
	var passing sync.WaitGroup
	for !(ended[0] && ended[1]) && pr.failed.Load() == nil {
		var states [2]sideState
		changed := func() bool {
			for i, c := range conns {
				if !ended[i] {
					states[i] = stateOf(c)
				}
			}
			return states != [2]sideState{}
		}
		mu.Lock()
		onA := waitOnA
		mu.Unlock()
		if onA {
			if err := rc.Read(func(uintptr) bool { return changed() }); err != nil {
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					pr.fail(conns, fmt.Errorf("fastpath: %w", err)) // closed
					break
				}
				mu.Lock()
				a.SetReadDeadline(time.Time{})
				mu.Unlock()
				continue // woken: look again
			}
		} else if !changed() {
			<-pr.woken
			continue
		}
		for i, st := range states {
			switch {
			case st.err != nil:
				pr.fail(conns, fmt.Errorf("fastpath: %w", st.err))
			case st.ended || st.left:
				ended[i] = true
				if i == 0 && st.left {
					mu.Lock()
					waitOnA = false
					a.SetReadDeadline(time.Time{})
					mu.Unlock()
				}
				passing.Add(1)
				go func() {
					defer passing.Done()
					if err := pr.passEnd(i, conns, st.left); err != nil {
						pr.fail(conns, fmt.Errorf("fastpath: %w", err))
					} else if i == 0 && st.left {
						// a is read no more: back to its poller, which
						// a Close (an abort) wakes; woken would not be.
						mu.Lock()
						waitOnA = true
						mu.Unlock()
						pr.wake()
					}
				}()
			}
		}
	}
	passing.Wait()
	aToB, bToA = pr.Bytes()
	if e := pr.failed.Load(); e != nil {
		err = *e
	}
	return aToB, bToA, err
}

// wake tells Run to look again, when it waits on woken.
func (pr *Pair) wake() {
	select {
	case pr.woken <- struct{}{}:
	default:
	}
}

// fail ends both sides at once with a reset, err the cause, unless they
// failed before: every wait on them returns.
func (pr *Pair) fail(conns [2]*net.TCPConn, err error) {
	if pr.failed.CompareAndSwap(nil, &err) {
		for _, c := range conns {
			c.SetLinger(0)
			c.SetReadDeadline(time.Now())
		}
	}
	pr.wake()
}

// sideState is what a side's socket says: a reset, bytes the verdict
// left to user space, or its peer's end; nothing of those while the
// peer may still send.
type sideState struct {
	err         error
	left, ended bool
}

// stateOf reads c's state: its socket error, whether bytes wait to be
// read (once its peer fell MaxQueued behind, the verdict leaves them),
// and its TCP state, which says whether the other end has finished.
func stateOf(c *net.TCPConn) sideState {
	var st sideState
	var probe [1]byte
	err := withFD(c, func(fd int) error {
		if e, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			return errors.Join(err, syscall.Errno(e))
		}
		if n, _, _ := unix.Recvfrom(fd, probe[:], unix.MSG_PEEK|unix.MSG_DONTWAIT); n > 0 {
			st.left = true
			return nil
		}
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return err
		}
		// Established, or ended only on this side: the other end may
		// still send. Any other state is after its end (a socket whose
		// both ends are done is closed, its time-wait kept apart); a
		// reset shows as SO_ERROR.
		switch info.State {
		case unix.BPF_TCP_ESTABLISHED, unix.BPF_TCP_FIN_WAIT1, unix.BPF_TCP_FIN_WAIT2:
		default:
			st.ended = true
		}
		return nil
	})
	if err != nil {
		return sideState{err: err}
	}
	return st
}

// passEnd passes side i's end of stream on, once every byte the verdict
// redirected from it is queued on the other side; with bytes left to
// user space, it relays the direction to its end first.
func (pr *Pair) passEnd(i int, conns [2]*net.TCPConn, left bool) error {
	src, dst := conns[i], conns[1-i]
	if err := pr.drain(i, dst); err != nil {
		return err
	}
	if left {
		if err := pr.relayRest(i, dst, src); err != nil {
			return err
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
