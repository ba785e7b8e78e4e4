//go:build linux

package fastpath

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// The values of a stream verdict.
const (
	skDrop = 0
	skPass = 1
)

// peer is a socket's entry in the peers map: where its bytes go, and how
// many have gone.
//
//	struct peer { __u32 slot; __u32 pad; __u64 bytes; };
const (
	peerSlotOff  = 0
	peerBytesOff = 8
	peerSize     = 16
)

// verdictProgram redirects each skb a socket in the map receives to its
// peer's slot, counting its bytes; a socket the peers map does not know
// keeps its bytes (SK_PASS), for user space.
func verdictProgram(sockets, peers *ebpf.Map) asm.Instructions {
	return asm.Instructions{
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
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R1, asm.R6, 0, asm.Word),                   // skb->len
		asm.AddAtomic.Mem(asm.R7, asm.R1, asm.DWord, peerBytesOff), // peer->bytes += len
		asm.LoadMem(asm.R3, asm.R7, peerSlotOff, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, sockets.FD()),
		asm.Mov.Imm(asm.R4, 0), // to the peer's egress: sent on its connection
		asm.FnSkRedirectMap.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, skDrop).WithSymbol("drop"),
		asm.Return(),
	}
}
