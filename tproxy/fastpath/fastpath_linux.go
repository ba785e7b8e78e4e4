//go:build linux

package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Path moves the bytes of spliced connection pairs in the kernel: a BPF
// sockmap whose stream verdict redirects what each socket receives to its
// peer's send queue, counting the bytes each way.
//
// Two sockmaps hold a pair's sockets at the same slots: targets, where
// the verdict sends bytes to, and watched, whose sockets the verdict
// judges. A socket joins watched only once its peer is in targets, so
// that no byte is sent to an empty slot, which would drop it.
type Path struct {
	watched, targets, peers *ebpf.Map
	totals                  *ebpf.Map // what all directions have queued, and the bound
	senders                 *ebpf.Map // by a socket's cookie, the cookie of the socket whose bytes go to it
	resumes                 *ebpf.Map // by a socket's cookie, what user space has relayed of its bytes left to it
	overruns                *ebpf.Map // a ring of the cookies of sockets whose bytes left to user space passed the bound
	overrunReader           *ringbuf.Reader
	overrunDone             chan struct{}
	prog                    *ebpf.Program
	watch                   *watcher

	rechargeProg *ebpf.Program
	rechargeIter *link.Iter
	rechargeStop chan struct{}
	rechargeDone chan struct{}
	recharged    atomic.Int64 // the passes rechargeLoop ran
	// chargeMu orders what user space does to charges: a recharge, and
	// each direction's release.
	chargeMu sync.Mutex

	mu       sync.Mutex
	pairs    map[uint64]*Pair // by each socket's cookie
	free     []uint32         // free slots of the sockmaps
	released uint64           // of the total charged, by pairs done with it
	bound    uint64
}

// New refuses, with ErrSockmapDefect: the caller keeps the user-space
// relay, as it does without the privilege or the kernel's support.
func New(int) (*Path, error) { return nil, ErrSockmapDefect }

// ErrSockmapDefect is why New refuses. On the kernel this package was
// measured on (6.18), bytes that a socket in a sockmap receives and its
// verdict leaves to user space can be read back, by recvmsg, as stale
// contents of other memory, under traffic a sandbox can make: a server
// that sends one-byte segments, scattered through its pages, to a client
// that reads none of them, while the client uploads fast. Of 10 uploads
// of 256 MiB so, 9 came out with a stretch of bytes that were never sent
// at that point (another part of the stream here; another connection's,
// for all one can tell), 2 of 10 with every byte left to user space and
// none redirected, none through a splicing relay
// (BenchmarkScatteredSegments); none of 8 with no byte left to user
// space, but then nothing bounds what the kernel holds. Measured again
// side by side, after Run stopped peeking (pollRead, which ended a second
// fault: a whole segment read twice): 9 of 10 on the kernel path, 8 of 10
// with the peek; with every byte left to user space, 0 of 10 either way.
// And a flood both ways at once, unpaced, that the path takes after its
// first bytes still comes back, a few times in a thousand (8 MiB each
// way, through an echoing server), with bytes repeated (65,483 or 95,232;
// now and then 24 or 53); in 5 of 9 such streams the direction had every
// byte after the splice redirected, none relayed, and the verdict counted
// the repeated bytes itself: the kernel handed it the same bytes twice
// (tproxy's BenchmarkTwoWayFloods: 2 to 7 of 1,000 floods in five runs,
// each broken one it checked taken by the kernel path, 0 through the
// splicing relay beside it). A stream must never carry what it was not sent, so the
// kernel path stays off until the kernel's defect is found and fixed;
// NewDespiteDefect loads it where that has been ruled out, and the
// benchmarks show whether it is.
var ErrSockmapDefect = errors.New("fastpath: off: on this kernel a socket in a sockmap can hand user space bytes it was never sent (see ErrSockmapDefect)")

// NewDespiteDefect loads the programs and maps for up to pairs connection
// pairs, ErrSockmapDefect notwithstanding: for the tests, the benchmarks
// and a kernel its operator has shown free of the defect. It fails
// without the privilege (CAP_BPF and CAP_NET_ADMIN) or the kernel
// support, and then the caller keeps the user-space relay.
func NewDespiteDefect(pairs int) (*Path, error) { return load(pairs, true) }

// load is NewDespiteDefect. Without sendRoom, the verdict redirects
// past the room in the peer's send queue: tests use it to make bytes wait
// on the kernel path, as they do when TCP, short of memory, does not take
// into a send queue what it had room for, which is what MaxQueued, the
// total and the overrun bound are for.
func load(pairs int, sendRoom bool) (*Path, error) {
	if pairs <= 0 {
		return nil, errors.New("fastpath: no pairs")
	}
	p := &Path{pairs: map[uint64]*Pair{}}
	var err error
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	sockmap := func(name string) (*ebpf.Map, error) {
		return ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(2 * pairs)})
	}
	if p.watched, err = sockmap("egress_watched"); err != nil {
		return nil, fmt.Errorf("fastpath: sockmap: %w", err)
	}
	if p.targets, err = sockmap("egress_targets"); err != nil {
		return nil, fmt.Errorf("fastpath: sockmap: %w", err)
	}
	if p.peers, err = ebpf.NewMap(&ebpf.MapSpec{Name: "egress_peers", Type: ebpf.Hash, KeySize: 8, ValueSize: peerSize, MaxEntries: uint32(2 * pairs)}); err != nil {
		return nil, fmt.Errorf("fastpath: peers map: %w", err)
	}
	if p.totals, err = ebpf.NewMap(&ebpf.MapSpec{Name: "egress_totals", Type: ebpf.Array, KeySize: 4, ValueSize: totalsSize, MaxEntries: 2}); err != nil {
		return nil, fmt.Errorf("fastpath: totals map: %w", err)
	}
	if p.senders, err = ebpf.NewMap(&ebpf.MapSpec{Name: "egress_senders", Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: uint32(2 * pairs)}); err != nil {
		return nil, fmt.Errorf("fastpath: senders map: %w", err)
	}
	if p.resumes, err = ebpf.NewMap(&ebpf.MapSpec{Name: "egress_resumes", Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: uint32(2 * pairs)}); err != nil {
		return nil, fmt.Errorf("fastpath: resumes map: %w", err)
	}
	if p.overruns, err = ebpf.NewMap(&ebpf.MapSpec{Name: "egress_overruns", Type: ebpf.RingBuf, MaxEntries: overrunRing}); err != nil {
		return nil, fmt.Errorf("fastpath: overruns ring: %w", err)
	}
	if err = p.SetMaxQueuedTotal(DefaultMaxQueuedTotal); err != nil {
		return nil, err
	}
	peerSock, err := tcpSockLayout()
	if err != nil {
		return nil, fmt.Errorf("fastpath: %w", err)
	}
	if p.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{Name: "egress_verdict", Type: ebpf.SkSKB, AttachType: ebpf.AttachSkSKBStreamVerdict,
		Instructions: verdictProgram(p.targets, p.peers, p.totals, p.resumes, p.overruns, maxUnrelayed(), peerSock, sendRoom), License: programLicense}); err != nil {
		return nil, fmt.Errorf("fastpath: verdict program: %w", err)
	}
	if err = link.RawAttachProgram(link.RawAttachProgramOptions{Target: p.watched.FD(), Program: p.prog, Attach: ebpf.AttachSkSKBStreamVerdict}); err != nil {
		return nil, fmt.Errorf("fastpath: attach the verdict: %w", err)
	}
	if p.rechargeProg, p.rechargeIter, err = newRecharge(p.senders, p.peers, p.totals, peerSock.writeSeq); err != nil {
		return nil, err
	}
	if p.watch, err = newWatcher(); err != nil {
		return nil, err
	}
	if p.overrunReader, err = ringbuf.NewReader(p.overruns); err != nil {
		return nil, fmt.Errorf("fastpath: overruns ring: %w", err)
	}
	p.overrunDone = make(chan struct{})
	go p.overrunLoop()
	p.rechargeStop, p.rechargeDone = make(chan struct{}), make(chan struct{})
	go p.rechargeLoop()
	for i := 2*pairs - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	return p, nil
}

// Close unloads the programs and maps, once every pair's Run has
// returned; pairs still in the maps are dropped from them, and their
// sockets go on as plain sockets.
func (p *Path) Close() error {
	if p.rechargeStop != nil {
		close(p.rechargeStop)
		<-p.rechargeDone
	}
	if p.overrunReader != nil {
		p.overrunReader.Close()
		<-p.overrunDone
	}
	if p.watch != nil {
		p.watch.close()
	}
	var iterErr error
	if p.rechargeIter != nil {
		iterErr = p.rechargeIter.Close()
	}
	return errors.Join(iterErr, p.rechargeProg.Close(), p.prog.Close(), p.watched.Close(), p.targets.Close(), p.peers.Close(), p.totals.Close(), p.senders.Close(), p.resumes.Close(), p.overruns.Close()) // each is nil-safe
}

// SetMaxQueuedTotal sets the bound on what all directions of all pairs
// may have queued together (DefaultMaxQueuedTotal until then).
func (p *Path) SetMaxQueuedTotal(n int64) error {
	if n <= 0 {
		return errors.New("fastpath: the bound on queued bytes must be positive")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bound = uint64(n)
	return p.writeReleasedLocked()
}

// writeReleasedLocked writes what pairs have released, and the bound,
// where the verdict reads them.
func (p *Path) writeReleasedLocked() error {
	var v [totalsSize]byte
	binary.NativeEndian.PutUint64(v[0:], p.released)
	binary.NativeEndian.PutUint64(v[8:], p.bound)
	if err := p.totals.Update(uint32(totalsReleased), v[:], ebpf.UpdateAny); err != nil {
		return fmt.Errorf("fastpath: totals: %w", err)
	}
	return nil
}

// Queued is what all directions of all pairs have queued and their
// peers not yet taken, as the verdict charges it against the bound.
func (p *Path) Queued() int64 {
	var v [totalsSize]byte
	if err := p.totals.Lookup(uint32(totalsCharged), v[:]); err != nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(binary.NativeEndian.Uint64(v[:]) - p.released)
}

// Pair is two connections whose bytes the kernel moves to each other.
type Pair struct {
	p       *Path
	slots   [2]uint32
	cookies [2]uint64
	// base is what each socket's sending side had taken before the
	// kernel path could send on it: what it sends after is redirected.
	base [2]int64
	// taken is what the caller had read of each socket before the
	// splice: what it received after is the pair's to move.
	taken [2]int64
	// relayed is what Run copied itself, of a direction the verdict left
	// to user space.
	relayed [2]atomic.Int64
	// failed is the first failure of either direction (or the caller's
	// Abort), which ends both.
	failed atomic.Pointer[failure]
	// conns are the pair's sockets, a then b, for Abort.
	conns [2]*net.TCPConn
	// woken tells Run of a change it waits for without Go's poller.
	woken      chan struct{}
	removeOnce sync.Once
	// released says which directions' charges the total no longer holds
	// (under the Path's chargeMu).
	released [2]bool
}

// Splice puts a and b in the kernel path: from now on what either
// receives is sent on the other, starting with what each received and
// the caller did not read. The caller reads each socket until nothing
// waits, or not at all: the verdict is handed whole skbs, and one the
// caller read part of would be sent again from its start. An error
// means the pair took nothing (a socket already half-closed cannot join
// the map), and the caller relays the connection itself.
func (p *Path) Splice(a, b *net.TCPConn) (*Pair, error) {
	p.mu.Lock()
	if len(p.free) < 2 {
		p.mu.Unlock()
		return nil, errors.New("fastpath: full")
	}
	conns := [2]*net.TCPConn{a, b}
	pr := &Pair{p: p, slots: [2]uint32{p.free[len(p.free)-1], p.free[len(p.free)-2]}, woken: make(chan struct{}, 1), conns: conns}
	p.free = p.free[:len(p.free)-2]
	p.mu.Unlock()
	for i, c := range conns {
		cookie, err := socketCookie(c)
		if err != nil {
			pr.Remove()
			return nil, err
		}
		pr.cookies[i] = cookie
		if pr.base[i], _, err = queued(c); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: send queue: %w", err)
		}
		if pr.taken[i], err = taken(c); errors.Is(err, ErrUrgentData) {
			pr.Remove()
			return nil, err
		} else if err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: receive queue: %w", err)
		}
	}
	// Where bytes go, then how much went, then what is judged: a
	// socket's verdict finds its peer in place from the first skb.
	for i, c := range conns {
		if err := withFD(c, func(fd int) error { return p.targets.Update(pr.slots[i], uint32(fd), ebpf.UpdateAny) }); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: sockmap: %w", err)
		}
	}
	for i := range conns {
		var v [peerSize]byte
		binary.NativeEndian.PutUint32(v[peerSlotOff:], pr.slots[1-i])
		if err := p.peers.Update(pr.cookies[i], v[:], ebpf.UpdateNoExist); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: peers: %w", err)
		}
		if err := p.senders.Update(pr.cookies[1-i], pr.cookies[i], ebpf.UpdateAny); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: senders: %w", err)
		}
	}
	p.mu.Lock()
	for _, cookie := range pr.cookies {
		p.pairs[cookie] = pr
	}
	p.mu.Unlock()
	for i, c := range conns {
		if err := withFD(c, func(fd int) error { return p.watched.Update(pr.slots[i], uint32(fd), ebpf.UpdateAny) }); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: sockmap: %w", err)
		}
	}
	// Bytes that arrived before a socket joined the map wait in its
	// receive queue until something wakes its verdict: more bytes, or a
	// read. A read that takes nothing (a peek, not waiting) is that
	// wake, so nothing sent before the splice waits for the next bytes.
	var probe [1]byte
	for _, c := range conns {
		withFD(c, func(fd int) error {
			unix.Recvfrom(fd, probe[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return nil
		})
	}
	return pr, nil
}

// Bytes returns the bytes moved from a to b and from b to a.
func (pr *Pair) Bytes() (aToB, bToA int64) {
	r := pr.redirected()
	return r[0] + pr.relayed[0].Load(), r[1] + pr.relayed[1].Load()
}

// redirected is what the verdict sent on from each side.
func (pr *Pair) redirected() [2]int64 {
	var out [2]int64
	for i := range 2 {
		out[i], _ = pr.peerCount(i, peerBytesOff)
	}
	return out
}

// peerCount is the verdict's count at off (peerBytesOff, peerPassedOff,
// peerChargedOff) in side i's peer entry, and whether it could be read.
func (pr *Pair) peerCount(i, off int) (int64, bool) {
	var v [peerSize]byte
	if pr.cookies[i] == 0 || pr.p.peers.Lookup(pr.cookies[i], v[:]) != nil {
		return 0, false
	}
	return int64(binary.NativeEndian.Uint64(v[off:])), true
}

// Remove takes the pair out of the kernel path (closing the sockets does
// too) and frees its slots; the counts are gone with it, so read Bytes
// first.
func (pr *Pair) Remove() {
	pr.removeOnce.Do(func() {
		for i := range 2 {
			pr.p.watched.Delete(pr.slots[i])
		}
		for i := range 2 {
			pr.release(i)
		}
		for i := range 2 {
			pr.p.targets.Delete(pr.slots[i])
			if pr.cookies[i] != 0 {
				pr.p.peers.Delete(pr.cookies[i])
				pr.p.resumes.Delete(pr.cookies[i])
			}
		}
		pr.p.mu.Lock()
		for _, cookie := range pr.cookies {
			if pr.p.pairs[cookie] == pr {
				delete(pr.p.pairs, cookie)
			}
		}
		pr.p.free = append(pr.p.free, pr.slots[0], pr.slots[1])
		pr.p.mu.Unlock()
	})
}

// release takes direction i's charge out of the total, once: its bytes
// have all left the kernel path's queue (or the pair is gone).
func (pr *Pair) release(i int) {
	pr.p.chargeMu.Lock()
	defer pr.p.chargeMu.Unlock()
	if pr.released[i] {
		return
	}
	// Out of the recharge program's sight first: it would lower a
	// charge the total no longer holds. A failure keeps the charge, as
	// each failure here does: more directions stay in user space, none
	// queues more.
	if err := pr.p.senders.Delete(pr.cookies[1-i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return
	}
	charged, ok := pr.peerCount(i, peerChargedOff)
	if !ok {
		return
	}
	pr.released[i] = true
	pr.p.mu.Lock()
	defer pr.p.mu.Unlock()
	pr.p.released += uint64(charged)
	pr.p.writeReleasedLocked()
}

func socketCookie(c *net.TCPConn) (uint64, error) {
	var cookie uint64
	err := withFD(c, func(fd int) error {
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
		cookie = v
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("fastpath: socket cookie: %w", err)
	}
	return cookie, nil
}

func withFD(c *net.TCPConn, f func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// Move splices a and b and returns the wait for their end (Run, then
// Remove) and what cuts them short (Abort). It is the form
// tproxy.Proxy's KernelPath takes.
func (p *Path) Move(a, b *net.TCPConn) (wait func() (aToB, bToA int64, err error), abort func(), err error) {
	pr, err := p.Splice(a, b)
	if err != nil {
		return nil, nil, err
	}
	return func() (int64, int64, error) {
		defer pr.Remove()
		return pr.Run(a, b)
	}, pr.Abort, nil
}

// overrunRetry is how long overrunLoop waits after the ring failed a
// read, before it reads again.
const overrunRetry = 100 * time.Millisecond

// overrunRing is the size of the overruns ring: room for 2,048 cookies
// between two reads, each in its 8-byte header.
const overrunRing = 32 << 10

// ErrOverrun fails a pair whose bytes left to user space waited, past
// the bound, behind a receiver on the same socket that took none: in the
// kernel's backlog nothing charges them, and TCP's window does not hold
// their sender back, so the verdict dropped them. It is the cause of a
// SideError, whose message names the package.
var ErrOverrun = errors.New("bytes waited behind a receiver that takes none, past the bound")

// overrunLoop fails each pair whose cookie the verdict writes to the
// overruns ring, until Close. It waits on the ring, polling nothing.
func (p *Path) overrunLoop() {
	defer close(p.overrunDone)
	for {
		rec, err := p.overrunReader.Read()
		switch {
		case errors.Is(err, ringbuf.ErrClosed):
			return
		case err != nil:
			// Not a spin: the verdict keeps dropping past the bound and
			// writes again at the next skb.
			time.Sleep(overrunRetry)
			continue
		case len(rec.RawSample) < 8:
			continue
		}
		cookie := binary.NativeEndian.Uint64(rec.RawSample)
		p.mu.Lock()
		pr := p.pairs[cookie]
		p.mu.Unlock()
		if pr == nil {
			continue
		}
		side := 0
		if pr.cookies[1] == cookie {
			side = 1
		}
		pr.fail(pr.conns, &SideError{Side: side, Err: ErrOverrun})
	}
}

// maxUnrelayed bounds what a direction may have left to user space and
// user space not yet relayed: what TCP lets a socket's receive buffer
// hold (tcp_rmem's largest, which autotuning reaches), where such bytes
// wait while the sender is held back, and MaxQueued more for those on
// their way.
func maxUnrelayed() int32 {
	rmem := int64(6 << 20) // the kernel's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 3 {
			if n, err := strconv.ParseInt(f[2], 10, 64); err == nil && n > 0 {
				rmem = n
			}
		}
	}
	return int32(min(rmem+MaxQueued, 1<<30))
}
