//go:build linux

package fastpath

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// A direction's charge is brought up to date by its verdicts, which run
// only when it sends: one that queued a burst and fell quiet would stay
// charged its burst after its peer had taken it all, and enough of them
// (a thousand idle keep-alive connections, each charged its last
// response's final skb) would hold the bound and send other directions
// to user space for nothing. The recharge program brings every
// direction's charge down to what it has queued now; the Path runs it
// while the total charged is past a quarter of the bound.
const (
	// rechargeEvery is how often, at most, the recharge program runs.
	rechargeEvery = 100 * time.Millisecond
	// rechargeShare bounds the recharge program's share of a core: a
	// pass that took d waits at least rechargeShare*d before the next.
	rechargeShare = 20
)

// The recharge program's context, struct bpf_iter__tcp: pointers to the
// iterator's metadata and to the socket.
const iterSockOff = 8

// rechargeProgram visits each TCP socket (an iterator over them all) and,
// for one the kernel path sends to, lowers the charge of the direction
// sent to it to what that direction has queued now (redirected, less
// what the socket has taken to send since its base), never raising it: a
// direction whose charge lags behind its bytes is its verdict's to
// charge. senders maps the cookie of a socket on the path to the cookie
// of the socket whose bytes go to it.
//
// A verdict that runs between the program's read of a charge and its
// write wins: the program leaves that direction alone (CmpXchg). A
// verdict's write that the program wins is not added to the total either
// (verdictProgram), so the total stays the sum of the directions'
// charges; that charge may lack the one skb the verdict was judging,
// until the direction's next verdict.
//
// It iterates over every TCP socket rather than the sockmap's: this
// kernel refuses iterators over a map's elements.
func rechargeProgram(senders, peers, totals *ebpf.Map, writeSeqOff int16) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, iterSockOff, asm.DWord),
		asm.JEq.Imm(asm.R6, 0, "done"), // the iterator's last call has none
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.LoadMapPtr(asm.R1, senders.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "done"),            // not on the kernel path
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord), // the sender's cookie
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -16),
		asm.LoadMapPtr(asm.R1, peers.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "done"),
		asm.Mov.Reg(asm.R9, asm.R0), // the sender's entry
		asm.LoadMem(asm.R1, asm.R9, peerSeqSetOff, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "done"), // nothing redirected yet

		// queued = redirected + relayed - (write_seq - base), modulo
		// 2^32; past 2^31 the socket took more than that (bytes relayed
		// in user space since the direction last came back): none
		// queued.
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnSkcToTcpSock.Call(),
		asm.JEq.Imm(asm.R0, 0, "done"),
		asm.LoadMem(asm.R2, asm.R0, writeSeqOff, asm.Word),
		asm.LoadMem(asm.R1, asm.R9, peerBaseSeqOff, asm.Word),
		asm.Sub.Reg32(asm.R2, asm.R1),
		asm.LoadMem(asm.R1, asm.R9, peerBytesOff, asm.DWord),
		asm.LoadMem(asm.R3, asm.R9, peerRelayedOff, asm.DWord),
		asm.Add.Reg(asm.R1, asm.R3),
		asm.Sub.Reg32(asm.R1, asm.R2),
		asm.JLE.Imm(asm.R1, math.MaxInt32, "counted"),
		asm.Mov.Imm(asm.R1, 0),
		// charged = queued + queued * skbOverhead / avg_len, as the
		// verdict charges it.
		asm.LoadMem(asm.R3, asm.R9, peerAvgLenOff, asm.Word).WithSymbol("counted"),
		asm.JNE.Imm(asm.R3, 0, "averaged"),
		asm.Mov.Imm(asm.R3, 1),
		asm.Mov.Reg(asm.R4, asm.R1).WithSymbol("averaged"),
		asm.Mul.Imm(asm.R4, skbOverhead),
		asm.Div.Reg(asm.R4, asm.R3),
		asm.Add.Reg(asm.R1, asm.R4),

		asm.LoadMem(asm.R0, asm.R9, peerChargedOff, asm.DWord),
		asm.JGE.Reg(asm.R1, asm.R0, "done"),
		asm.Mov.Reg(asm.R7, asm.R0), // the charge before
		cmpXchg(asm.R9, asm.R1, peerChargedOff),
		asm.JNE.Reg(asm.R0, asm.R7, "done"), // a verdict came between: its charge is newer
		asm.Sub.Reg(asm.R1, asm.R7),         // the change, below zero
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, totalsCharged, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, totals.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "done"),
		asm.AddAtomic.Mem(asm.R0, asm.R6, asm.DWord, 0),

		asm.Mov.Imm(asm.R0, 0).WithSymbol("done"), // on to the next socket
		asm.Return(),
	}
}

// newRecharge loads the recharge program and attaches it as an iterator
// over TCP sockets, which a read runs.
func newRecharge(senders, peers, totals *ebpf.Map, writeSeqOff int16) (*ebpf.Program, *link.Iter, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "egress_recharge", Type: ebpf.Tracing, AttachType: ebpf.AttachTraceIter, AttachTo: "tcp",
		Instructions: rechargeProgram(senders, peers, totals, writeSeqOff), License: programLicense})
	if err != nil {
		return nil, nil, fmt.Errorf("fastpath: recharge program: %w", err)
	}
	it, err := link.AttachIter(link.IterOptions{Program: prog})
	if err != nil {
		prog.Close()
		return nil, nil, fmt.Errorf("fastpath: recharge iterator: %w", err)
	}
	return prog, it, nil
}

// recharge runs the recharge program over every TCP socket of the
// network namespace it runs in (the Path's: a socket elsewhere keeps its
// charge, too high, never too low).
// Releases wait for it (chargeMu): a direction released while the
// program lowers its charge would leave the total short of it.
func (p *Path) recharge() error {
	p.chargeMu.Lock()
	defer p.chargeMu.Unlock()
	r, err := p.rechargeIter.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(io.Discard, r) // the program writes nothing: one read visits every socket
	return err
}

// rechargeLoop runs the recharge program while the total charged is past
// a quarter of the bound, every rechargeEvery at most, until Close.
func (p *Path) rechargeLoop() {
	defer close(p.rechargeDone)
	timer := time.NewTimer(rechargeEvery)
	defer timer.Stop()
	for {
		select {
		case <-p.rechargeStop:
			return
		case <-timer.C:
		}
		wait := rechargeEvery
		p.mu.Lock()
		bound := int64(p.bound)
		p.mu.Unlock()
		if p.Queued() > bound/4 {
			start := time.Now()
			p.recharge() // a failure leaves charges as they were: too high, never too low
			wait = max(wait, rechargeShare*time.Since(start))
			p.recharged.Add(1)
		}
		timer.Reset(wait)
	}
}
