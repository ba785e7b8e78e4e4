package tproxy

import (
	"errors"
	"math"
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// canSplice: Linux moves bytes between two TCP sockets in the kernel.
const canSplice = true

// copy moves bytes from src to dst until src's end of stream or limit
// bytes: spliced when both ends are TCP, through user space otherwise.
func (r *relay) copy(dst, src net.Conn, pace *pacer, limit int64) (int64, error) {
	if r.spliced {
		return r.spliceCopy(dst.(*net.TCPConn), src.(*net.TCPConn), pace, limit)
	}
	return r.copyTracked(dst, src, pace, limit)
}

// idle returns how long no byte has moved either way. Spliced bytes never
// reach user space, so for those the kernel says: TCP_INFO's time since
// data was last received, on both sockets.
func (r *relay) idle() time.Duration {
	if r.spliced {
		return min(idleFor(r.client.(*net.TCPConn)), idleFor(r.up))
	}
	return r.sinceActive()
}

// clientGone says whether c's peer has ended its side or reset it,
// whatever bytes wait to be read.
func clientGone(c net.Conn) (bool, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false, errors.ErrUnsupported
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false, err
	}
	var gone bool
	var infoErr error
	if err := rc.Control(func(fd uintptr) {
		if e, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			gone = true
			return
		}
		var info *unix.TCPInfo
		if info, infoErr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); infoErr == nil {
			gone = info.State != unix.BPF_TCP_ESTABLISHED
		}
	}); err != nil {
		return true, nil // closed
	}
	return gone, infoErr
}

// idleFor returns how long ago c last received data. A socket that
// cannot say (closed, by Forget or a failure) receives nothing more: it
// is idle without end, so that its relay's other side is not held open
// by it.
func idleFor(c *net.TCPConn) time.Duration {
	d := time.Duration(math.MaxInt64)
	rc, err := c.SyscallConn()
	if err != nil {
		return d
	}
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			d = time.Duration(info.Last_data_recv) * time.Millisecond
		}
	})
	return d
}

// Why not io.Copy: between two *net.TCPConn it splices too, but it holds a
// 64 KiB pipe for as long as the source is silent, so every idle
// connection pins two pipes (four descriptors), and it moves at most one
// pipe's worth per pair of system calls. spliceCopy borrows a pipe only
// while bytes are moving (an idle connection holds none) and sizes its
// pipes at 1 MiB. BenchmarkBulkThroughput and
// BenchmarkIdleConnectionMemory measure both effects.

// pipeSize is the capacity asked of each pipe (F_SETPIPE_SZ); the kernel
// may grant less (fs.pipe-max-size), which only costs throughput.
const pipeSize = 1 << 20

// pipe is a pipe used to splice between sockets; it is always empty when
// it is in the pool.
type pipe struct{ r, w int }

// pipePool keeps a bounded number of empty pipes for reuse.
var pipePool = make(chan *pipe, 256)

func getPipe() (*pipe, error) {
	select {
	case p := <-pipePool:
		return p, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, err
	}
	unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize) // best effort
	return &pipe{r: fds[0], w: fds[1]}, nil
}

// putPipe returns an empty pipe to the pool, or closes it.
func putPipe(p *pipe) {
	select {
	case pipePool <- p:
	default:
		p.close()
	}
}

func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// spliceCopy moves bytes from src to dst with splice(2) until src's end of
// stream or limit bytes, returning the count. A pipe is taken from the pool when src has
// bytes and returned, empty, before waiting for more. Each pipe's worth is
// held to pace. Urgent data is passed on as urgent data (takeUrgent).
func (r *relay) spliceCopy(dst, src *net.TCPConn, pace *pacer, limit int64) (int64, error) {
	srcRaw, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	dstRaw, err := dst.SyscallConn()
	if err != nil {
		return 0, err
	}
	var total int64
	for total < limit {
		var p *pipe
		var inPipe int
		var spliceErr error
		var urgent byte
		var atMark bool
		// Fill a pipe from src (fillPipe); wait, holding no pipe, while
		// src is empty.
		err := srcRaw.Read(func(fd uintptr) bool {
			if p == nil {
				if p, spliceErr = getPipe(); spliceErr != nil {
					return true
				}
			}
			inPipe, spliceErr = fillPipe(p, int(fd), dstRaw, int(min(int64(pace.chunk(pipeSize)), limit-total)))
			if inPipe <= 0 && (spliceErr == nil || spliceErr == unix.EAGAIN) {
				if urgent, atMark, spliceErr = takeUrgent(int(fd), spliceErr); atMark {
					return true
				}
			}
			if spliceErr == unix.EAGAIN {
				putPipe(p)
				p = nil
				return false
			}
			return true
		})
		if err == nil {
			err = spliceErr
		}
		if err == nil && atMark {
			putPipe(p)
			if err := r.passUrgent(dstRaw, urgent); err != nil {
				return total, err
			}
			total++
			continue
		}
		if err != nil || inPipe == 0 {
			if p != nil {
				if inPipe == 0 {
					putPipe(p)
				} else {
					p.close()
				}
			}
			return total, err // inPipe == 0 and no error: end of stream
		}
		n, err := p.drain(dstRaw, inPipe)
		total += int64(n)
		if err != nil {
			p.close() // it may still hold bytes
			return total, err
		}
		putPipe(p)
		pace.moved(int64(inPipe))
	}
	return total, nil
}

// fillPipe splices up to want bytes from the socket src into p: minFill
// at first, and more only as far as dst's send buffer has room for them
// now. So bytes a destination does not take wait in the source's receive
// queue, where TCP counts them and its window holds the sender back,
// rather than in a pipe, which nothing bounds (1 MiB a direction, for
// every connection whose reader stalls). A connection whose bytes come a
// few at a time asks nothing of dst.
func fillPipe(p *pipe, src int, dst syscall.RawConn, want int) (int, error) {
	n, err := spliceRetry(src, p.w, min(want, minFill))
	if err != nil || n < minFill || want <= minFill {
		return n, err
	}
	room, err := sendRoom(dst)
	if err != nil || room <= int64(n) {
		return n, nil // what is in the pipe goes first; an error comes again
	}
	// src's end, its urgent mark or its error, if this meets them, is
	// the next fill's.
	if m, _ := spliceRetry(src, p.w, int(min(int64(want), room))-n); m > 0 {
		n += m
	}
	return n, nil
}

// minFill is what a pipe is filled with before dst's room is asked: no
// more than a destination that never takes it should hold, and enough
// that a connection moving little asks nothing more.
const minFill = 16 << 10

// sendRoom is what dst's send buffer can take now: its size less what it
// holds, as the kernel counts both.
func sendRoom(dst syscall.RawConn) (int64, error) {
	var mem [unix.SK_MEMINFO_VARS]uint32
	var sockErr error
	if err := dst.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(mem))
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
			sockErr = e
		}
	}); err != nil {
		return 0, err
	}
	if sockErr != nil {
		return 0, sockErr
	}
	return int64(mem[unix.SK_MEMINFO_SNDBUF]) - int64(mem[unix.SK_MEMINFO_WMEM_QUEUED]), nil
}

// drain moves the n bytes the pipe holds into dst, waiting while dst's
// send queue is full, and returns how many it moved.
func (p *pipe) drain(dst syscall.RawConn, n int) (int, error) {
	moved := 0
	for moved < n {
		var m int
		var spliceErr error
		err := dst.Write(func(fd uintptr) bool {
			m, spliceErr = spliceRetry(p.r, int(fd), n-moved)
			return spliceErr != unix.EAGAIN
		})
		if err = errors.Join(err, spliceErr); err != nil {
			return moved, err
		}
		moved += m
	}
	return moved, nil
}

// flush moves what src has received to dst, without waiting for more,
// until src's receive queue is empty (at emptied: what arrives after is
// whole skbs), or it has moved limit bytes (at full), or src's end of
// stream.
func (r *relay) flush(dst, src net.Conn, limit int64) (n int64, at stop, ended bool, err error) {
	srcRaw, err := src.(*net.TCPConn).SyscallConn()
	if err != nil {
		return 0, running, false, err
	}
	dstRaw, err := dst.(*net.TCPConn).SyscallConn()
	if err != nil {
		return 0, running, false, err
	}
	p, err := getPipe()
	if err != nil {
		return 0, running, false, err
	}
	for n < limit {
		var inPipe int
		var spliceErr error
		var urgent byte
		var atMark bool
		// Control, not Read: the handover's deadline has passed.
		if err := srcRaw.Control(func(fd uintptr) {
			inPipe, spliceErr = fillPipe(p, int(fd), dstRaw, int(min(pipeSize, limit-n)))
			if inPipe <= 0 && (spliceErr == nil || spliceErr == unix.EAGAIN) {
				urgent, atMark, spliceErr = takeUrgent(int(fd), spliceErr)
			}
		}); err != nil {
			putPipe(p)
			return n, running, false, err
		}
		if spliceErr == nil && atMark {
			if err := r.passUrgent(dstRaw, urgent); err != nil {
				putPipe(p)
				return n, running, false, err
			}
			n++
			continue
		}
		switch {
		case spliceErr == unix.EAGAIN:
			putPipe(p)
			return n, emptied, false, nil
		case spliceErr != nil:
			putPipe(p)
			return n, running, false, spliceErr
		case inPipe == 0:
			putPipe(p)
			return n, running, true, nil
		}
		m, err := p.drain(dstRaw, inPipe)
		n += int64(m)
		if err != nil {
			p.close()
			return n, running, false, err
		}
	}
	putPipe(p)
	return n, full, false, nil
}

// urgentInline has c's urgent data (MSG_OOB) read in its place in the
// stream (SO_OOBINLINE), where the relay finds it (takeUrgent). Out of
// band, a lone urgent byte never made the socket readable (the kernel
// waits for the byte after it), and a read skipped it.
func urgentInline(c *net.TCPConn) {
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_OOBINLINE, 1) })
	}
}

// takeUrgent is called on the socket fd when splice has moved nothing
// (spliceErr nil or EAGAIN). splice never reads past TCP's urgent mark
// (MSG_OOB: telnet's interrupt, FTP's abort, a database client's
// break): at the mark it says EAGAIN, or 0 if the stream's end has come
// too, so a relay would stall there, or take the mark for the end. So at
// a mark whose byte has come, takeUrgent reads that byte, inline
// (urgentInline, made sure of here: a byte that came before is read
// inline all the same), after which splice goes on. Elsewhere, and
// while the byte has not come, it returns spliceErr as it was.
func takeUrgent(fd int, spliceErr error) (b byte, ok bool, err error) {
	if at, err := unix.IoctlGetInt(fd, unix.SIOCATMARK); err != nil || at == 0 {
		return 0, false, spliceErr
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1); err != nil {
		return 0, false, err
	}
	var buf [1]byte
	if n, _, err := unix.Recvfrom(fd, buf[:], unix.MSG_DONTWAIT); err != nil || n == 0 {
		return 0, false, spliceErr // the byte has not come yet (EAGAIN), or never will: as splice said
	}
	return buf[0], true, nil
}

// passUrgent sends b on dst as urgent data, at the same place in the
// stream. The connection stays on the user-space relay from then on: the
// kernel path would pass urgent data on as ordinary bytes.
func (r *relay) passUrgent(dst syscall.RawConn, b byte) error {
	r.urgent.Store(true)
	var sendErr error
	err := dst.Write(func(fd uintptr) bool {
		sendErr = unix.Sendto(int(fd), []byte{b}, unix.MSG_OOB|unix.MSG_DONTWAIT, nil)
		return sendErr != unix.EAGAIN
	})
	return errors.Join(err, sendErr)
}

// spliceRetry calls splice(2) without blocking on the pipe, retrying on
// EINTR.
func spliceRetry(in, out, n int) (int, error) {
	for {
		m, err := unix.Splice(in, nil, out, nil, n, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if err != syscall.EINTR {
			return int(m), err
		}
	}
}
