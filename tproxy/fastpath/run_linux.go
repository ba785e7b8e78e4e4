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

	"github.com/cilium/ebpf"
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
					states[i] = pr.stateOf(i, c)
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
				pr.fail(conns, &SideError{Side: i, Err: st.err})
			case st.ended || st.left:
				ended[i] = true
				if i == 0 {
					// passEnd may read a (bytes left to user space, or
					// still on their way): Run's wait on a's poller would
					// hold a's read lock from it.
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
					} else if i == 0 {
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
	if f := pr.failed.Load(); f != nil {
		aToB, bToA, err = f.sent(0, aToB), f.sent(1, bToA), f.err
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
// failed before: every wait on them returns. What each side's socket had
// taken to send is read first, while both are open.
func (pr *Pair) fail(conns [2]*net.TCPConn, err error) {
	f := &failure{err: err, took: pr.tookToSend(conns)}
	if pr.failed.CompareAndSwap(nil, f) {
		for _, c := range conns {
			c.SetLinger(0)
			c.SetDeadline(time.Now()) // a relayed direction may wait in a write too
		}
	}
	pr.wake()
}

// Abort ends both sides at once with a reset, as a failure does, and Run
// returns ErrAborted. What each socket had taken to send when Abort came
// is what Run counts as moved, so a caller that closes the sockets
// straight after (to end them whatever Run is doing) loses no count.
func (pr *Pair) Abort() {
	pr.fail(pr.conns, ErrAborted)
}

// ErrAborted is Run's error after Abort.
var ErrAborted = errors.New("fastpath: aborted by its caller")

// failure is how a pair failed: the cause, and what each direction's
// destination had taken to send by then (-1 if it could not say).
type failure struct {
	err  error
	took [2]int64
}

// sent is what direction i sent of the moved bytes it counted: no more
// than its destination had taken when the pair failed. The verdict
// counts a byte as it redirects it, and the reset drops what it
// redirected that the destination had not yet taken, unsent; a relay's
// count, what its writes put in the socket, never holds such bytes.
func (f *failure) sent(i int, moved int64) int64 {
	if f.took[i] < 0 {
		return moved
	}
	return min(moved, f.took[i])
}

// tookToSend is what each direction's destination (the other side's
// socket) has taken to send since the splice, whether or not it has sent
// it yet; -1 for a socket that cannot say (closed).
func (pr *Pair) tookToSend(conns [2]*net.TCPConn) [2]int64 {
	took := [2]int64{-1, -1}
	for i := range 2 {
		if q, _, err := queued(conns[1-i]); err == nil {
			took[i] = max(q-pr.base[1-i], 0)
		}
	}
	return took
}

// SideError is a failure of one side's socket (a reset): Side 0 for the
// first socket Run (or Move) was given, 1 for the second; Run's caller
// can say which direction's source failed, as a relay does.
type SideError struct {
	Side int
	Err  error
}

func (e *SideError) Error() string { return "fastpath: " + e.Err.Error() }

func (e *SideError) Unwrap() error { return e.Err }

// FailedSide is Side, for a caller that knows the error only by this
// method (tproxy, which does not import this package).
func (e *SideError) FailedSide() int { return e.Side }

// sideState is what a side's socket says: a reset, bytes the verdict
// left to user space, or its peer's end; nothing of those while the
// peer may still send.
type sideState struct {
	err         error
	left, ended bool
}

// stateOf reads the state of side i's socket c: its socket error,
// whether bytes the verdict left it wait to be read (once its peer fell
// MaxQueued behind, the verdict leaves them), and its TCP state, which
// says whether the other end has finished.
func (pr *Pair) stateOf(i int, c *net.TCPConn) sideState {
	var st sideState
	err := withFD(c, func(fd int) error {
		if e, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			return errors.Join(err, syscall.Errno(e))
		}
		if ev, err := pollRead(fd); err == nil && ev&unix.POLLIN != 0 && ev&unix.POLLRDHUP == 0 && pr.leftWaiting(i) {
			st.left = true // bytes, and no end yet: an end is the TCP state's to tell
			return nil
		}
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return err
		}
		st.ended = stateAfterEnd(info.State)
		return nil
	})
	if err != nil {
		return sideState{err: err}
	}
	return st
}

// stateAfterEnd says whether a socket in TCP state st has received its
// peer's end. Established, or ended only on this side: the other end may
// still send. Any other state is after its end (a socket whose both ends
// are done is closed, its time-wait kept apart); a reset shows as
// SO_ERROR.
func stateAfterEnd(st uint8) bool {
	switch st {
	case unix.BPF_TCP_ESTABLISHED, unix.BPF_TCP_FIN_WAIT1, unix.BPF_TCP_FIN_WAIT2:
		return false
	}
	return true
}

// passEnd passes side i's end of stream on, once every byte the verdict
// redirected from it is queued on the other side; with bytes left to
// user space (seen, or still on their way), it relays the direction to
// its end first.
func (pr *Pair) passEnd(i int, conns [2]*net.TCPConn, left bool) error {
	src, dst := conns[i], conns[1-i]
	if !left {
		if err := pr.drain(i, dst); err != nil {
			return err
		}
		unmoved, err := pr.unmoved(i, src)
		if err != nil {
			return err
		}
		left = unmoved > 0
	}
	if left {
		if err := pr.relayRest(i, dst, src); err != nil {
			return err
		}
	}
	// What the verdict redirected after the direction came back.
	if err := pr.drain(i, dst); err != nil {
		return err
	}
	pr.release(i) // the verdict queues no more of i's bytes
	// Its failure is not the connection's, as a relay's half-close is
	// not: a peer already gone (ENOTCONN) has nothing left to be told.
	dst.CloseWrite()
	return nil
}

// drain waits until dst has taken to send every byte moved from side i
// (what the verdict redirected, and what relayRest wrote), asking after
// 1 ms, then less often, up to every 50 ms: a receiver that never takes
// them holds the connection until it is closed (the idle timeout, say),
// as it would hold a relay's write. It stops when dst's connection is
// gone (reset by its peer, which has left: its bytes go with it, as a
// relay's written into a socket whose peer resets go) or the other
// direction failed.
func (pr *Pair) drain(i int, dst *net.TCPConn) error {
	moved := pr.moved(i) + pr.relayed[i].Load()
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

// relayBuffers are relayRest's, 256 KiB: each write is followed by a
// system call that tells the verdict the count, and each read preceded
// by a poll and the drain's two, so a larger buffer costs fewer a byte.
// A bulk stream on loopback, most of which Run relays, moved 1.28-1.34
// times a splicing relay's bytes with it, 1.02-1.12 with 64 KiB, in the
// same runs (BenchmarkBulk). A buffer is held only while bytes wait.
var relayBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// relayRest copies side i's bytes to dst until its end of stream, for a
// direction the verdict left to user space. It reads with recvmsg (what
// the verdict left is queued for it alone; splicing would not see it),
// and writes only once dst has taken what the verdict redirected before.
// After each write it tells the verdict what it has relayed: once that is
// all the verdict left, the direction is back on the kernel path, and
// relayRest waits on the socket, with no buffer, for what the verdict
// leaves it next, or the end.
//
// A socket in the sockmap reads its end of stream as soon as its peer's
// end has arrived, even while bytes the verdict left to it still wait in
// the kernel's backlog (for a receive buffer too small to take them at
// once): an end is believed only once the pair has moved every byte the
// socket received. Bytes that do not come within endGrace of the last
// fail the connection, which a reset then tells both sides: a stream
// cut short must never look whole.
func (pr *Pair) relayRest(i int, dst, src *net.TCPConn) error {
	wait, waited := time.Millisecond, time.Duration(0)
	for {
		moved, err := pr.relayOnce(i, dst, src)
		if moved {
			wait, waited = time.Millisecond, 0
		}
		if err == io.EOF {
			unmoved, uerr := pr.unmoved(i, src)
			switch {
			case uerr != nil:
				return uerr
			case unmoved <= 0:
				return nil
			case pr.failed.Load() != nil:
				return errors.New("the other direction failed")
			case pr.sendsWait(i, src):
				// The bytes wait in the kernel's backlog behind src's own
				// sends, as long as src's receiver takes none: not lost.
				waited = 0
			case waited >= endGrace:
				return fmt.Errorf("%d bytes received never came out of the kernel path", unmoved)
			}
			time.Sleep(wait)
			waited += wait
			wait = min(2*wait, 50*time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
	}
}

// relayOnce reads what src has for user space and writes it to dst, once
// dst has taken what the verdict redirected before, then tells the
// verdict what has been relayed. It waits for the bytes before it takes
// a buffer, so that a direction back on the kernel path holds none. Its
// error is the read's (io.EOF at the end) or what stopped the write.
func (pr *Pair) relayOnce(i int, dst, src *net.TCPConn) (moved bool, err error) {
	if err := pr.awaitReadable(i, src); err != nil {
		return false, err
	}
	bp := relayBuffers.Get().(*[]byte)
	defer relayBuffers.Put(bp)
	n, err := src.Read(*bp)
	if n == 0 {
		return false, err
	}
	if derr := pr.drain(i, dst); derr != nil {
		return false, derr
	}
	m, werr := dst.Write((*bp)[:n])
	relayed := pr.relayed[i].Add(int64(m)) // what went, if not all did: the record's count
	if werr != nil {
		return true, werr
	}
	// Once the verdict has left no more than this, its next bytes go on
	// the kernel path again (a failure here only keeps them in user
	// space).
	pr.p.resumes.Update(pr.cookies[i], uint64(relayed), ebpf.UpdateAny)
	return true, err
}

// awaitReadable waits, reading nothing, until side i's socket c has
// bytes the verdict left it, its end or a reset, or its read deadline
// passes (Abort's); a reset is its error, as a read would have said it.
func (pr *Pair) awaitReadable(i int, c *net.TCPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var waitErr error
	if err := rc.Read(func(fd uintptr) bool {
		var ev int16
		if ev, waitErr = pollRead(int(fd)); waitErr != nil {
			return true
		}
		if ev&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
				waitErr = errors.Join(err, syscall.Errno(e))
			}
			return true
		}
		return ev&unix.POLLRDHUP != 0 || ev&unix.POLLIN != 0 && pr.leftWaiting(i)
	}); err != nil {
		return err
	}
	return waitErr
}

// unrelayed is how many of side i's bytes the verdict has left to user
// space and Run has not relayed yet, by the verdict's own count, and
// whether the count could be read.
func (pr *Pair) unrelayed(i int) (int64, bool) {
	passed, ok := pr.peerCount(i, peerPassedOff)
	if !ok {
		return 0, false
	}
	return passed - pr.relayed[i].Load(), true
}

// leftWaiting says whether bytes the verdict left side i may wait for
// user space: poll(2) also says a socket is readable for bytes the
// verdict has redirected, in the moment before the kernel counts them
// taken, and the verdict's count tells them apart. Where the count cannot
// be read, they may, and the read that follows finds out.
func (pr *Pair) leftWaiting(i int) bool {
	n, ok := pr.unrelayed(i)
	return !ok || n > 0
}

// pollRead is what poll(2) says now of fd's reading side: bytes or an
// end to read (POLLIN), the end come (POLLRDHUP), a reset (POLLERR). It
// reads nothing, and neither Run nor relayRest asks a socket in the
// sockmap with a read that takes nothing (a peek): on the kernel this
// package was measured on, with a peek before each read, 6 of about
// 1,600 bulk downloads of 60 MiB came out with a whole segment (65,483
// bytes, one skb) twice, some of them with every byte read by user space
// and none redirected; with poll, 0 of about 2,800, the kernel path
// taking 96% of the last 1,200 (tproxy's BenchmarkWholeDownloads, side by
// side with the splicing relay, 0 either way). Splice's one peek, which
// wakes the verdict for bytes that came before the socket joined the map,
// is the only one.
func pollRead(fd int) (int16, error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	for {
		if _, err := unix.Poll(fds, 0); err != unix.EINTR {
			return fds[0].Revents, err
		}
	}
}

// endGrace bounds the wait for bytes a socket received after its end was
// read: the kernel's backlog hands them on at once, unless something is
// wrong, or its own sends wait there before them (sendsWait).
const endGrace = 5 * time.Second

// sendsWait says whether side i's socket has not yet taken to send all
// the other direction moved to it: the kernel's backlog, which holds what
// the verdict redirected to the socket and what it left the socket in
// one queue, holds the rest of those sends, and behind them what side i
// received.
func (pr *Pair) sendsWait(i int, src *net.TCPConn) bool {
	q, closed, err := queued(src)
	if err != nil || closed {
		return false
	}
	return q-pr.base[i] < pr.moved(1-i)+pr.relayed[1-i].Load()
}

// unmoved is how many of the bytes side i has received since the splice
// (its end of stream, which counts one in TCP's sequence, not counted)
// the pair has neither redirected nor relayed.
func (pr *Pair) unmoved(i int, src *net.TCPConn) (int64, error) {
	var received int64
	err := withFD(src, func(fd int) error {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return err
		}
		received = int64(info.Bytes_received)
		if received > 0 && stateAfterEnd(info.State) {
			received--
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return received - pr.taken[i] - pr.moved(i) - pr.relayed[i].Load(), nil
}

// moved is what the kernel path redirected from side i.
func (pr *Pair) moved(i int) int64 {
	return pr.redirected()[i]
}

// ErrUrgentData refuses a socket whose TCP urgent data (MSG_OOB) waits
// to be read: its receive queue cannot be measured (the kernel counts it
// only up to the urgent mark), and the kernel path would pass the urgent
// byte on as an ordinary one. A socket that reads urgent data inline
// (SO_OOBINLINE) is measured whole, and the kernel answers no urgent
// read on it: its urgent byte goes on inline, as one that comes after the
// splice does.
var ErrUrgentData = errors.New("fastpath: urgent data waits to be read")

// taken is how many bytes the reader of c has taken so far: all it
// received, less what waits in its receive queue, read until the two
// agree (bytes may arrive between the reads).
func taken(c *net.TCPConn) (int64, error) {
	var n int64
	err := withFD(c, func(fd int) error {
		for range 16 {
			before, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				return err
			}
			inq, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
			if err != nil {
				return err
			}
			var urgent [1]byte
			if _, _, err := unix.Recvfrom(fd, urgent[:], unix.MSG_OOB|unix.MSG_PEEK|unix.MSG_DONTWAIT); err != unix.EINVAL {
				return ErrUrgentData // the urgent byte is there (no error), or on its way (EAGAIN)
			}
			after, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				return err
			}
			if before.Bytes_received == after.Bytes_received {
				n = int64(after.Bytes_received) - int64(inq)
				return nil
			}
		}
		return errors.New("bytes kept arriving")
	})
	return n, err
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
