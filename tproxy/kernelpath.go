package tproxy

import "net"

// KernelPath moves a judged connection's bytes in the kernel, so that
// they never cross into the gateway's process; tproxy/fastpath.Path is
// one. The proxy offers it a connection only when nothing more is to be
// done with its bytes: passed through (not intercepted, not plain HTTP),
// TCP on both sides, and the agent without a byte-rate quota; and only
// once one direction has moved Proxy.KernelPathAfter bytes on the
// user-space relay, both still open, and while the agent holds fewer than
// Proxy.KernelPathPerAgent connections on it. Every other connection, and one Move
// refuses, stays on the user-space relay; the record's Relay says which
// moved it.
type KernelPath interface {
	// Move starts moving what each side sends to the other, beginning
	// with what each has received and the proxy has not read. wait
	// returns once both directions have ended, each end passed on as a
	// half-close, with the bytes moved each way; it fails on a reset,
	// after which both connections are to be closed. A failure of one
	// side's socket that says which (a FailedSide() int method: 0 the
	// client, 1 the upstream, and Unwrap to its cause) is recorded as the
	// user-space relay records a failure of that direction's source.
	// abort, which may come while wait waits, ends both directions with
	// a reset and wait with them; the proxy closes both connections
	// straight after it, so it fixes the counts first, at what each
	// side's socket had taken to send (what a relay counts: not bytes the
	// kernel held for a receiver that never took them). A nil abort
	// leaves the proxy's resets alone to end both. An error from
	// Move means it took nothing.
	Move(client, upstream *net.TCPConn) (wait func() (up, down int64, err error), abort func(), err error)
}
