//go:build linux

package fastpath

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

// programLicense is the verdict program's: the kernel lets only a
// GPL-compatible program read its structures (tcp_sock), so the program
// (verdictProgram's instructions, and nothing else of this module, which
// is Apache-2.0) is offered under the BSD 2-clause license or the GPL
// version 2, as Cilium's datapath is.
const programLicense = "Dual BSD/GPL"

// The values of a stream verdict.
const (
	skDrop = 0
	skPass = 1
)

// userOverrun is a peer's user field once what was left to user space
// passed the bound on what may wait unrelayed and the overruns ring took
// the socket's cookie: the pair is being failed, and the verdict drops
// what comes.
const userOverrun = 2

// peer is a socket's entry in the peers map: where its bytes go, how many
// have gone, and whether the direction has left the kernel path.
//
//	struct peer {
//		__u32 slot;     // the peer's slot in targets
//		__u32 user;     // 1: the direction is relayed in user space, for now; 2: overrun
//		__u64 bytes;    // bytes redirected to the peer
//		__u32 base_seq; // the peer's write_seq at the first verdict
//		__u32 seq_set;  // base_seq is set
//		__u32 avg_len;  // the recent skbs' mean length (a moving average)
//		__u32 pad;
//		__u64 charged;  // what this direction last added to the total queued
//		__u64 relayed;  // what user space had relayed when the direction came back
//		__u64 passed;   // bytes left to user space
//	};
const (
	peerSlotOff    = 0
	peerUserOff    = 4
	peerBytesOff   = 8
	peerBaseSeqOff = 16
	peerSeqSetOff  = 20
	peerAvgLenOff  = 24
	peerChargedOff = 32
	peerRelayedOff = 40
	peerPassedOff  = 48
	peerSize       = 56
)

// The totals map's entries, each two 64-bit words: what all directions
// have charged (the verdict's, which adds to it atomically), and what
// user space has released of it with the bound (user space's alone, so
// that neither overwrites the other).
//
//	totals[0] = { charged, unused }
//	totals[1] = { released, bound }
const (
	totalsCharged  = 0
	totalsReleased = 1
	totalsSize     = 16
)

// MaxQueued bounds what one direction may have redirected and its peer
// not yet taken into its TCP send queue: the bytes, each skb charged
// skbOverhead more (scaled by the recent skbs' mean length, since the
// skbs waiting are not seen one by one), so that a sender of one-byte
// segments is held to as little memory as one of full ones. The kernel
// does not hold a sender back while a redirect waits (a sockmap redirect
// skips TCP's memory accounting), so past this bound the verdict stops
// redirecting that direction: its bytes go to the socket's own receive
// queue, where they count against its receive buffer (TCP's window then
// holds the sender back), and Run relays them in user space until it has
// relayed all the verdict left it (resumes). The room in the peer's send
// queue bounds it first (tcp_wmem's largest, 4 MiB by default, and the
// send queue takes what fits at once); MaxQueued holds whatever the
// sysctl says.
const MaxQueued = 4 << 20

// DefaultMaxQueuedTotal bounds what all directions of all pairs may have
// queued together, charged as MaxQueued charges one: without it, each of
// an agent's thousands of connections could queue MaxQueued, many GiB in
// all, outside the kernel's TCP memory accounting. Past it, a direction
// that would queue more leaves the kernel path, as past MaxQueued, and
// its bytes wait in its socket's receive buffer, where TCP accounts for
// them. Path.SetMaxQueuedTotal changes it.
const DefaultMaxQueuedTotal = 256 << 20

// skbOverhead is what a queued skb costs beyond its bytes, about: the
// sk_buff, its shared info and the slab's rounding.
const skbOverhead = 1 << 10

// tcpSock is where struct tcp_sock keeps what the programs read of a
// peer's socket, read from the kernel's BTF: write_seq (the sequence
// number after the last byte queued to send), and its struct sock's
// sk_wmem_queued and sk_sndbuf (what its send queue holds, and may).
type tcpSock struct {
	writeSeq, wmemQueued, sndbuf int16
}

func tcpSockLayout() (tcpSock, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return tcpSock{}, fmt.Errorf("kernel BTF: %w", err)
	}
	var ts *btf.Struct
	if err := spec.TypeByName("tcp_sock", &ts); err != nil {
		return tcpSock{}, fmt.Errorf("kernel BTF: %w", err)
	}
	var l tcpSock
	for _, f := range []struct {
		off  *int16
		path []string
	}{
		{&l.writeSeq, []string{"write_seq"}},
		{&l.wmemQueued, []string{"inet_conn", "icsk_inet", "sk", "sk_wmem_queued"}},
		{&l.sndbuf, []string{"inet_conn", "icsk_inet", "sk", "sk_sndbuf"}},
	} {
		if *f.off, err = memberOffset(ts, f.path); err != nil {
			return tcpSock{}, fmt.Errorf("kernel BTF: tcp_sock.%s: %w", strings.Join(f.path, "."), err)
		}
	}
	return l, nil
}

// memberOffset is where the member at path (a member of s, then of that
// member's struct, and so on) lies in s, in bytes.
func memberOffset(s *btf.Struct, path []string) (int16, error) {
	var off btf.Bits
	t := btf.Type(s)
	for _, name := range path {
		st, ok := btf.UnderlyingType(t).(*btf.Struct)
		if !ok {
			return 0, fmt.Errorf("%s is not in a struct", name)
		}
		var m *btf.Member
		for k := range st.Members {
			if st.Members[k].Name == name {
				m = &st.Members[k]
			}
		}
		if m == nil || m.BitfieldSize != 0 {
			return 0, fmt.Errorf("no member %s", name)
		}
		off += m.Offset
		t = m.Type
	}
	return int16(off.Bytes()), nil
}

// verdictProgram redirects each skb a socket in the map receives to its
// peer's slot in targets, counting its bytes, while the peer's send
// queue has room for all that waits to go there, the peer has taken all
// but MaxQueued of what was redirected to it, and all directions
// together stay within the bound in totals; past either, and for a
// socket the peers map does not know, the bytes stay with the socket
// (SK_PASS), for user space, counted, until what user space has relayed
// (resumes, by the socket's cookie) is all the verdict left it.
func verdictProgram(targets, peers, totals, resumes, overruns *ebpf.Map, maxUnrelayed int32, peerSock tcpSock, sendRoom bool) asm.Instructions {
	verdict := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // the skb
		// An skb without data (its end of stream) is not sent on: the
		// end is passed on by Run, after the data.
		asm.LoadMem(asm.R1, asm.R6, 0, asm.Word), // skb->len
		asm.JEq.Imm(asm.R1, 0, "drop"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetSocketCookie.Call(),
		asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.LoadMapPtr(asm.R1, peers.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R7, asm.R0), // the peer entry
		asm.LoadMem(asm.R1, asm.R7, peerUserOff, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "judge"),
		asm.JEq.Imm(asm.R1, userOverrun, "drop"),

		// Left to user space: back on the kernel path once user space
		// has relayed every byte left to it (its count, in resumes, is
		// written after the bytes are in the peer's send queue), so that
		// these bytes go after those.
		asm.Mov.Imm(asm.R8, 0), // what user space has relayed: nothing yet
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.LoadMapPtr(asm.R1, resumes.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "bounded"),
		asm.LoadMem(asm.R8, asm.R0, 0, asm.DWord),
		asm.LoadMem(asm.R2, asm.R7, peerPassedOff, asm.DWord),
		asm.JNE.Reg(asm.R8, asm.R2, "bounded"),
		asm.StoreMem(asm.R7, peerRelayedOff, asm.R8, asm.DWord),
		asm.StoreImm(asm.R7, peerUserOff, 0, asm.Word),
		asm.Ja.Label("judge"),

		// What is left and not yet relayed waits, when the socket's own
		// sends wait too (its receiver takes nothing), behind them in the
		// kernel's backlog, where nothing charges it and TCP's window
		// does not hold the sender back: past maxUnrelayed, the pair is
		// failed (its cookie to the overruns ring, for Run) and its bytes
		// dropped.
		asm.LoadMem(asm.R1, asm.R7, peerPassedOff, asm.DWord).WithSymbol("bounded"),
		asm.Sub.Reg(asm.R1, asm.R8),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // skb->len
		asm.Add.Reg(asm.R1, asm.R2),
	}
	verdict = append(verdict, charge("-left")...) // each skb charged its overhead, as queued ones are
	verdict = append(verdict,
		asm.JLE.Imm(asm.R1, maxUnrelayed, "passed"),
		// Dropped whether or not the ring takes the cookie; marked
		// overrun only once it has, so that a full ring is tried again
		// at the next skb and the pair is failed all the same.
		asm.LoadMapPtr(asm.R1, overruns.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Imm(asm.R3, 8),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnRingbufOutput.Call(),
		asm.JNE.Imm(asm.R0, 0, "drop"),
		asm.StoreImm(asm.R7, peerUserOff, userOverrun, asm.Word),
		asm.Ja.Label("drop"),

		// The peer's write_seq: what it has taken to send.
		asm.LoadMem(asm.R1, asm.R7, peerSlotOff, asm.Word).WithSymbol("judge"),
		asm.StoreMem(asm.RFP, -12, asm.R1, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -12),
		asm.LoadMapPtr(asm.R1, targets.FD()),
		asm.FnMapLookupElem.Call(), // a reference to the peer's socket
		asm.JEq.Imm(asm.R0, 0, "user"),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.FnSkcToTcpSock.Call(),
		asm.JEq.Imm(asm.R0, 0, "release"),
		asm.LoadMem(asm.R9, asm.R0, peerSock.writeSeq, asm.Word),
		// And the room in its send queue, for what waits to go there.
		asm.LoadMem(asm.R1, asm.R0, peerSock.sndbuf, asm.Word),
		asm.LoadMem(asm.R2, asm.R0, peerSock.wmemQueued, asm.Word),
		asm.Sub.Reg(asm.R1, asm.R2),
		asm.StoreMem(asm.RFP, -24, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.FnSkRelease.Call(),

		// The first verdict takes the peer's write_seq as its base.
		asm.LoadMem(asm.R1, asm.R7, peerSeqSetOff, asm.Word),
		asm.JNE.Imm(asm.R1, 0, "based"),
		asm.StoreMem(asm.R7, peerBaseSeqOff, asm.R9, asm.Word),
		asm.StoreImm(asm.R7, peerSeqSetOff, 1, asm.Word),
		// queued = redirected + relayed - (write_seq - base), modulo 2^32.
		asm.LoadMem(asm.R1, asm.R7, peerBaseSeqOff, asm.Word).WithSymbol("based"),
		asm.Sub.Reg32(asm.R9, asm.R1),
		asm.LoadMem(asm.R1, asm.R7, peerBytesOff, asm.DWord),
		asm.LoadMem(asm.R2, asm.R7, peerRelayedOff, asm.DWord),
		asm.Add.Reg(asm.R1, asm.R2),
		asm.Sub.Reg32(asm.R1, asm.R9),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // skb->len
		asm.Add.Reg(asm.R1, asm.R2),
	)
	verdict = append(verdict, charge("")...)
	verdict = append(verdict,
		asm.JGT.Imm(asm.R1, MaxQueued, "user"),
	)
	if sendRoom {
		verdict = append(verdict,
			// What is redirected waits in the peer's backlog until its
			// send queue takes it, and so does all the peer's socket
			// receives for user space, behind it, uncharged: redirected
			// is only what the peer's send queue has room for now, so
			// that the backlog never waits on a receiver that takes
			// nothing.
			asm.LoadMem(asm.R2, asm.RFP, -24, asm.DWord),
			asm.JSGT.Reg(asm.R1, asm.R2, "user"),
		)
	}
	verdict = append(verdict,
		// The bound across all pairs: this direction's charge now takes
		// the place of what it charged before, in the total; one that
		// grows past the bound leaves the kernel path.
		asm.Mov.Reg(asm.R9, asm.R1),
	)
	verdict = append(verdict, lookupTotals(totals, totalsCharged)...)
	verdict = append(verdict,
		asm.Mov.Reg(asm.R8, asm.R0), // the total charged
	)
	verdict = append(verdict, lookupTotals(totals, totalsReleased)...)
	return append(verdict,
		asm.LoadMem(asm.R2, asm.R7, peerChargedOff, asm.DWord),
		asm.Mov.Reg(asm.R3, asm.R9),
		asm.Sub.Reg(asm.R3, asm.R2), // the change of this direction's charge
		asm.JSLE.Imm(asm.R3, 0, "fits"),
		asm.LoadMem(asm.R4, asm.R8, 0, asm.DWord),
		asm.LoadMem(asm.R5, asm.R0, 0, asm.DWord),
		asm.Sub.Reg(asm.R4, asm.R5), // what all directions have queued
		asm.Add.Reg(asm.R4, asm.R3),
		asm.LoadMem(asm.R5, asm.R0, 8, asm.DWord),
		asm.JSGT.Reg(asm.R4, asm.R5, "user"),
		// The new charge replaces the old unless the recharge program
		// replaced it meanwhile: then that charge stands until the next
		// verdict, and this one's change is not added, so the total
		// stays the sum of the directions' charges.
		asm.Mov.Reg(asm.R0, asm.R2).WithSymbol("fits"),
		cmpXchg(asm.R7, asm.R9, peerChargedOff),
		asm.JNE.Reg(asm.R0, asm.R2, "redirect"),
		asm.AddAtomic.Mem(asm.R8, asm.R3, asm.DWord, 0),

		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word).WithSymbol("redirect"), // skb->len
		asm.AddAtomic.Mem(asm.R7, asm.R2, asm.DWord, peerBytesOff),      // peer->bytes += len
		asm.LoadMem(asm.R3, asm.R7, peerSlotOff, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, targets.FD()),
		asm.Mov.Imm(asm.R4, 0), // to the peer's egress: sent on its connection
		asm.FnSkRedirectMap.Call(),
		asm.Return(),

		asm.Mov.Reg(asm.R1, asm.R8).WithSymbol("release"),
		asm.FnSkRelease.Call(),
		// From now on this direction's bytes are user space's, counted
		// as they are left to it.
		asm.StoreImm(asm.R7, peerUserOff, 1, asm.Word).WithSymbol("user"),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word).WithSymbol("passed"), // skb->len
		asm.AddAtomic.Mem(asm.R7, asm.R2, asm.DWord, peerPassedOff),
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skDrop).WithSymbol("drop"),
		asm.Return(),
	)
}

// cmpXchg compares R0 with the 64-bit word at dst+off and, where they
// are equal, writes src there; R0 is the word as it was. The operation
// is written into the immediate as well: cilium/ebpf v0.22.0 encodes an
// atomic instruction's immediate before it derives it from the opcode,
// so any atomic operation but an add would load as an add.
func cmpXchg(dst, src asm.Register, off int16) asm.Instruction {
	ins := asm.CmpXchg.Mem(dst, src, asm.DWord, off)
	ins.Constant = int64(asm.CmpXchg >> 8)
	return ins
}

// lookupTotals looks up the totals map's entry at key; its address is in
// R0 after, or the direction leaves the kernel path if there is none.
func lookupTotals(totals *ebpf.Map, key int32) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, -16, int64(key), asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -16),
		asm.LoadMapPtr(asm.R1, totals.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "user"),
	}
}

// charge turns R1, bytes waiting with the skb judged (R2, its length),
// into their charge, each skb charged skbOverhead more, scaled by the
// recent skbs' mean length (the skbs waiting are not seen one by one),
// which it brings up to date: avg_len += (len - avg_len) / 8, as
// avg_len - avg_len/8 + len/8, at least 1. suffix keeps its labels apart
// where it is used twice.
func charge(suffix string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R3, asm.R7, peerAvgLenOff, asm.Word),
		asm.JNE.Imm(asm.R3, 0, "averaged"+suffix),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.Ja.Label("clamped" + suffix),
		asm.Mov.Reg(asm.R4, asm.R3).WithSymbol("averaged" + suffix),
		asm.RSh.Imm(asm.R4, 3),
		asm.Sub.Reg(asm.R3, asm.R4),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.RSh.Imm(asm.R4, 3),
		asm.Add.Reg(asm.R3, asm.R4),
		asm.JNE.Imm(asm.R3, 0, "clamped"+suffix),
		asm.Mov.Imm(asm.R3, 1),
		asm.StoreMem(asm.R7, peerAvgLenOff, asm.R3, asm.Word).WithSymbol("clamped" + suffix),
		// charge = bytes + bytes * skbOverhead / avg_len
		asm.Mov.Reg(asm.R4, asm.R1),
		asm.Mul.Imm(asm.R4, skbOverhead),
		asm.Div.Reg(asm.R4, asm.R3),
		asm.Add.Reg(asm.R1, asm.R4),
	}
}
