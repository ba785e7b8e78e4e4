// Package fastpath moves the bytes of a judged, passed-through TCP
// connection in the kernel: once the gateway has decided and dialled,
// both sockets go into a BPF sockmap whose stream verdict redirects what
// each receives to the other's send queue, and counts the bytes each way.
// Nothing of the connection crosses into the process any more.
//
// It is off: New refuses with ErrSockmapDefect, because on the kernel it
// was measured on a socket in a sockmap can hand user space bytes that
// were never sent at that point of its stream, under traffic a sandbox
// can make (ErrSockmapDefect says which, and how often). The defect is
// the kernel's: with every byte left to user space and none redirected
// it shows all the same, and a splicing relay never shows it. Whenever a
// direction cannot be redirected (what follows) its bytes are read from
// the socket so, and no bound that keeps the kernel's memory in check
// does without that. NewDespiteDefect loads the path for the tests, the
// benchmarks, and a kernel shown free of the defect
// (BenchmarkScatteredSegments shows how often a kernel breaks, and
// tproxy's BenchmarkWholeDownloads how often a bulk download does;
// tproxy's TestScatteredSegmentsKeepTheStreamWhole holds its relay to the
// same traffic).
//
// Run passes each side's end of stream on as a half-close once every
// byte before it has left the kernel path, however long the receiver
// takes (an end that overtook queued bytes would cut the stream short);
// an end is a change of the socket's state, which wakes the waiter. It
// waits in its caller's goroutine alone (the Path's one watcher wakes it
// for the second socket), so an idle pair holds no goroutine of its own,
// and returns the bytes moved each way, for the connection's record.
//
// A sockmap redirect skips TCP's memory accounting: the kernel does not
// hold a sender back while the receiver is slower, and would queue
// whatever the sender sends (1.1 GiB in 3 s, here, for a server that read
// nothing). So the verdict, the one place bytes are redirected, redirects
// only what the peer's send queue has room for now (its sk_sndbuf less
// what it holds, sk_wmem_queued, less what was redirected to it and is
// not in it yet), and never more than MaxQueued ahead of it (each skb
// charged its overhead, so that one-byte segments are held to as little
// memory as full ones: a million of them took 1.8 GiB of slab before,
// 29 MiB now). Past either, the direction leaves the kernel path: its
// bytes stay on its own socket, charged to the receive buffer so that
// TCP's window holds the sender back, and Run relays them
// (TestSlowReaderHoldsTheSenderBack), each write after the peer has
// taken what was redirected before. After each write Run tells the
// verdict how much it has relayed; the verdict counts what it leaves,
// and once the two agree (every byte left is in the peer's send queue)
// its next bytes go on the kernel path again, after those, so that one
// burst does not keep a long connection in the process
// (TestDirectionComesBack). A sender that stays faster than the kernel's
// redirect (bulk on loopback) keeps ahead of Run, and its direction stays
// in user space while it does.
//
// The room matters beyond memory: what is redirected to a socket waits
// for its send queue in the socket's backlog, one queue with what the
// socket receives for user space, and what waits there is charged to
// nothing. Were redirected bytes to wait on a receiver that takes none,
// the bytes its own sender sends would wait behind them with TCP's
// window wide open: a client reading its download slowly while it
// uploads fast would be failed, or make the kernel hold its upload
// without end (TestFullDuplexWithASlowReader,
// TestUploadWhileTheDownloadWaits: a client that reads nothing while it
// uploads 256 MiB). Redirected only into room, they wait for no receiver.
// Should TCP, short of memory, not take into a send queue what it had
// room for, the verdict bounds what it has left and Run not yet relayed,
// each skb charged its overhead (the largest receive buffer TCP grants,
// and MaxQueued more); past it, it drops the bytes and writes the socket
// to a ring the Path waits on, which fails the pair (ErrOverrun, naming
// that side) for its caller to reset (TestBytesBehindAStuckReceiver,
// TestTinySegmentsBehindAStuckReceiver, on a Path that redirects past the
// room to stand for it). That bound is per direction: all pairs together
// are held to it times the pairs on the path (tproxy's KernelPathPerAgent
// bounds an agent's). An end that comes behind a socket's own sends
// waits for them as long as they wait (TestEndBehindAStuckReceiver).
//
// What all pairs together have redirected and their peers not yet taken
// is bounded too (DefaultMaxQueuedTotal, 256 MiB, Path.SetMaxQueuedTotal):
// should send queues not take what they had room for, a sandbox's
// thousands of connections could not each hold MaxQueued
// (TestQueuedBoundAcrossPairs, on a Path that redirects past the room,
// as the recharge's tests are). A direction's verdicts run only when it
// sends, so one that queued a burst and fell quiet would stay charged its
// burst after its peer took it all; while the total charged is past a
// quarter of the bound, a second program (an iterator over TCP sockets,
// run every 100 ms at most and at most a twentieth of a core) lowers each
// direction's charge to what it has queued now (TestQuietBurstIsRecharged,
// TestRechargeRunsNearTheBound). Charges of bytes gone so hold at most a
// quarter of the bound; a charge is never lowered below what is queued,
// but for the one skb a verdict judges while the recharge meets its
// direction, charged at that direction's next verdict. A pass takes
// 430 ns a socket (go test -run X -bench Recharge ./tproxy/fastpath).
// The bound is the Path's; tproxy bounds an agent's share by the
// connections it may hold on the path (Proxy.KernelPathPerAgent).
// Reading tcp_sock needs a GPL-compatible program: the verdict is
// offered under BSD or GPL (programLicense).
//
// An end of stream read from a socket in the sockmap is believed only
// once the pair has moved every byte the socket received (TCP_INFO's
// count, against what the caller had read before the splice): recvmsg
// reads the end while bytes the verdict left to user space may still
// wait in the kernel's backlog (TestEndSeenBeforeTheLastBytes). A socket
// whose urgent data (MSG_OOB) waits unread is refused (ErrUrgentData),
// unless it reads urgent data inline (SO_OOBINLINE, as tproxy's relay
// sets it): then the kernel tells nothing of it, and no byte is lost, as
// none is for urgent data that comes later, which is passed on inline, as
// an ordinary byte: a stream verdict sees no TCP flags.
//
// The verdict counts a byte as it redirects it. A pair cut short (a
// reset, or the caller's Abort) counts as moved no more than what each
// side's socket had taken to send by then (TCP_INFO's bytes acknowledged
// and the send queue, read before the reset): bytes the kernel path still
// held for a receiver that never took them go with the reset, unsent, and
// a relay would not have counted them either
// (TestAbortCountsWhatTheSocketTook).
//
// It is Linux only, needs CAP_BPF and CAP_NET_ADMIN (or root) and the
// kernel's BTF, and is optional: NewDespiteDefect fails with a reason
// without them, and the caller keeps its user-space relay.
//
// It is what tproxy.Proxy.KernelPath takes (Path.Move), once loaded.
// The caller reads each socket until nothing waits, or not at all,
// before Splice: the verdict is handed whole skbs, and one read in part
// would go again.
//
// On loopback here it moves bulk data at 0.61-0.70 of a direct
// connection, 1.22-1.39 of a relay that splices (go test -run X -bench
// '^BenchmarkBulk$' -benchtime 1073741824x ./tproxy/fastpath): the
// kernel's redirect, not the gateway, is the bound, and a loopback
// sender outpaces it, so past the room in its peer's send queue most of
// such a stream is relayed by Run, and tproxy's BenchmarkBulkThroughput
// (cpu-ms/GiB, the whole machine's CPU per GiB moved) finds it costlier
// than the splicing relay.
// A sender the redirect keeps up with (any link slower than loopback)
// stays on the path.
package fastpath
