// Package fastpath moves the bytes of a judged, passed-through TCP
// connection in the kernel: once the gateway has decided and dialled,
// both sockets go into a BPF sockmap whose stream verdict redirects what
// each receives to the other's send queue, and counts the bytes each way.
// Nothing of the connection crosses into the process any more.
//
// Run passes each side's end of stream on as a half-close once every
// byte before it has left the kernel path (an end is a change of the
// socket's state, which wakes the poller; the sockets are never read),
// and returns the bytes moved each way, for the connection's record.
//
// It is Linux only, needs CAP_BPF and CAP_NET_ADMIN (or root), and is
// optional: New fails with a reason without them, and the caller keeps
// its user-space relay.
//
// What the verdict redirects is queued on the peer's socket without
// bound: the kernel does not hold a sender back while the receiver is
// slower (sockmap redirects skip TCP's memory accounting, a known kernel
// limit; here a client wrote 1.1 GiB in 3 s to a server that read
// nothing). A sender can make the kernel hold as much as it sends, so a
// gateway turns the path on only for agents it trusts with the host's
// memory.
//
// It is what tproxy.Proxy.KernelPath takes (Path.Move). The caller reads
// each socket until nothing waits, or not at all, before Splice: the
// verdict is handed whole skbs, and one read in part would go again.
//
// On loopback here it moves bulk data at 0.40-0.42 of a direct
// connection, 0.80-1.02 of a relay that splices (go test -run X -bench
// '^BenchmarkBulk$' -benchtime 320000000x ./tproxy/fastpath): the
// redirect to a peer's send queue goes through the kernel's socket work
// queue, which costs what splicing does. It frees the process of the
// bytes, not yet the machine.
package fastpath
