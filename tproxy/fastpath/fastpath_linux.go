//go:build linux

package fastpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Path moves the bytes of spliced connection pairs in the kernel: a BPF
// sockmap whose stream verdict redirects what each socket receives to its
// peer's send queue, counting the bytes each way.
type Path struct {
	sockets, peers *ebpf.Map
	prog           *ebpf.Program

	mu   sync.Mutex
	free []uint32 // free slots of the sockets map
}

// New loads the programs and maps for up to pairs connection pairs. It
// fails without the privilege (CAP_BPF and CAP_NET_ADMIN) or the kernel
// support, and then the caller keeps the user-space relay.
func New(pairs int) (*Path, error) {
	if pairs <= 0 {
		return nil, errors.New("fastpath: no pairs")
	}
	sockets, err := ebpf.NewMap(&ebpf.MapSpec{Name: "egress_socks", Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(2 * pairs)})
	if err != nil {
		return nil, fmt.Errorf("fastpath: sockmap: %w", err)
	}
	peers, err := ebpf.NewMap(&ebpf.MapSpec{Name: "egress_peers", Type: ebpf.Hash, KeySize: 8, ValueSize: peerSize, MaxEntries: uint32(2 * pairs)})
	if err != nil {
		sockets.Close()
		return nil, fmt.Errorf("fastpath: peers map: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "egress_verdict", Type: ebpf.SkSKB, AttachType: ebpf.AttachSkSKBStreamVerdict,
		Instructions: verdictProgram(sockets, peers), License: "Apache-2.0"})
	if err != nil {
		sockets.Close()
		peers.Close()
		return nil, fmt.Errorf("fastpath: verdict program: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: sockets.FD(), Program: prog, Attach: ebpf.AttachSkSKBStreamVerdict}); err != nil {
		prog.Close()
		sockets.Close()
		peers.Close()
		return nil, fmt.Errorf("fastpath: attach the verdict: %w", err)
	}
	p := &Path{sockets: sockets, peers: peers, prog: prog}
	for i := 2*pairs - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	return p, nil
}

// Close unloads the programs and maps; pairs still in the map are dropped
// from it, and their sockets go on as plain sockets.
func (p *Path) Close() error {
	return errors.Join(p.prog.Close(), p.sockets.Close(), p.peers.Close())
}

// Pair is two connections whose bytes the kernel moves to each other.
type Pair struct {
	p       *Path
	slots   [2]uint32
	cookies [2]uint64
	// base is what each socket's sending side had taken before the
	// kernel path could send on it: what it sends after is redirected.
	base       [2]int64
	removeOnce sync.Once
}

// Splice puts a and b in the kernel path: from now on what either
// receives is sent on the other. Bytes already received and not read stay
// where they are: the caller reads them first.
func (p *Path) Splice(a, b *net.TCPConn) (*Pair, error) {
	p.mu.Lock()
	if len(p.free) < 2 {
		p.mu.Unlock()
		return nil, errors.New("fastpath: full")
	}
	pr := &Pair{p: p, slots: [2]uint32{p.free[len(p.free)-1], p.free[len(p.free)-2]}}
	p.free = p.free[:len(p.free)-2]
	p.mu.Unlock()
	conns := [2]*net.TCPConn{a, b}
	for i, c := range conns {
		cookie, err := socketCookie(c)
		if err != nil {
			pr.Remove()
			return nil, err
		}
		pr.cookies[i] = cookie
		if pr.base[i], err = queued(c); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: send queue: %w", err)
		}
	}
	// The peers first: a socket's bytes must find where they go from
	// the first skb the verdict sees.
	for i := range conns {
		var v [peerSize]byte
		binary.NativeEndian.PutUint32(v[peerSlotOff:], pr.slots[1-i])
		if err := p.peers.Update(pr.cookies[i], v[:], ebpf.UpdateNoExist); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: peers: %w", err)
		}
	}
	for i, c := range conns {
		if err := withFD(c, func(fd int) error { return p.sockets.Update(pr.slots[i], uint32(fd), ebpf.UpdateAny) }); err != nil {
			pr.Remove()
			return nil, fmt.Errorf("fastpath: sockmap: %w", err)
		}
	}
	return pr, nil
}

// Bytes returns the bytes the kernel moved from a to b and from b to a.
func (pr *Pair) Bytes() (aToB, bToA int64) {
	var out [2]int64
	for i := range 2 {
		var v [peerSize]byte
		if err := pr.p.peers.Lookup(pr.cookies[i], v[:]); err == nil {
			out[i] = int64(binary.NativeEndian.Uint64(v[peerBytesOff:]))
		}
	}
	return out[0], out[1]
}

// Remove takes the pair out of the kernel path (closing the sockets does
// too) and frees its slots; the counts are gone with it, so read Bytes
// first.
func (pr *Pair) Remove() {
	pr.removeOnce.Do(func() {
		for i := range 2 {
			pr.p.sockets.Delete(pr.slots[i])
			if pr.cookies[i] != 0 {
				pr.p.peers.Delete(pr.cookies[i])
			}
		}
		pr.p.mu.Lock()
		pr.p.free = append(pr.p.free, pr.slots[0], pr.slots[1])
		pr.p.mu.Unlock()
	})
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
