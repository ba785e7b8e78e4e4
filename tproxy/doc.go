// Package tproxy is the transparent TCP proxy and the explicit proxy.
//
// A sandbox's TCP arrives redirected by nftables; the proxy reads the
// original destination (SO_ORIGINAL_DST, IP6T_SO_ORIGINAL_DST), finds the
// agent by source address, and decides by name: TLS by the server name of
// the ClientHello (read whole, however many TCP segments or TLS records it
// spans), plain HTTP by the Host of every request on the connection, other
// TCP by the name the agent resolved to that address through dnsfilter.
// Plain HTTP is any first line a server would take for a request line,
// whatever the method's spelling or the line's length, and a first line
// that could still become one when the client pauses is judged as HTTP:
// no request reaches a server as other TCP, unjudged. An
// address or prefix rule (and open mode) allows the address itself. It
// then connects to what the name resolves to on the gateway, on the
// original port, through netguard's dial-time check, so a forged SNI or a
// hosts-file entry in the sandbox reaches nothing new.
//
// Allowed connections are spliced by the kernel on Linux when both ends
// are *net.TCPConn, half-closed in each direction, closed when idle (read
// from TCP_INFO, since spliced bytes never reach user space), and recorded
// in egresslog when they close. A listener may yield any net.Conn (a
// wrapper that counts bytes, a TLS connection): its bytes are then copied
// through user space, and the original destination is read from the TCP
// connection its NetConn method exposes. On other systems every copy goes
// through user space, and there is no original destination to read
// (OriginalDst is Linux only), so only the explicit proxy serves there
// unless Proxy.OriginalDst is set. With a Proxy.KernelPath (the package
// fastpath: a BPF sockmap, off for now, fastpath.ErrSockmapDefect), a
// passed-through connection's bytes move
// between its two sockets in the kernel once one direction has moved
// Proxy.KernelPathAfter bytes (an exchange done before then never pays
// for the move), and no longer cross into the process; relay.run alone
// chooses, per connection, and only when nothing more is to be done with
// its bytes (both ends TCP, no byte-rate quota), so every connection
// takes the same decisions, ends (idle, Rejudge, Forget, Shutdown) and
// record; the record's Relay says which path moved it. A handover waits
// until both directions have passed on what they hold at the same moment
// (each keeps moving what arrives meanwhile, so a peer that reads only
// once its writes go through never stalls); a sender that keeps its
// queue full stays on the relay. TCP urgent data (MSG_OOB) is passed on
// as urgent data at its place in the stream (splice stops at the urgent
// mark), and a connection that carried it stays on the relay, since the
// kernel path would pass it inline (as it passes an urgent byte that
// comes in the moment between the relay's last look and the handover, or
// after). Server-first protocols work: while the
// client is silent the proxy has already dialled the name the agent
// resolved, and the server's greeting flows. TLS for hosts an Interceptor
// claims (mitm) is handed over with the bytes already read.
//
// ServeExplicit serves the same decisions to clients that honour
// HTTPS_PROXY: CONNECT tunnels (whose contents are judged again, like a
// transparent connection) and absolute-form plain HTTP. A CONNECT is
// answered 200 only with its upstream connection in hand. A connection's
// first request, if it is a CONNECT, is read and answered by the proxy
// itself (http.ReadRequest, and the checks net/http's server adds); every
// other connection, and every later request, is served by net/http. Both
// reach the same serveConnect and the same per-source bounds.
//
// What is allowed is decided in one place per kind of traffic, always by
// the agent's policy of the moment: a connection by its name (decide),
// TCP that names nothing by judgeRaw, which looks up every name the agent
// resolved to the address whatever the mode (so a deny entry with a port
// wins under "*" and open mode); every plain HTTP request, transparent,
// explicit or h2c stream, by its own Host, method and path
// (policy.DecideHTTP); every request inside an intercepted connection by
// the Interceptor, through a policy.Current. A host whose requests the
// policy judges one by one (request entries, an MCP endpoint) is handed
// to the Interceptor, and relay, which every spliced connection passes,
// refuses it. Under a policy in ask mode, a name no entry allows is held
// while the Approver answers (askFor: TLS, plain HTTP, CONNECT).
// A connection on a port where no destination could be allowed is
// refused before its client speaks. When an agent's policy changes,
// Proxy.Rejudge ends what it now refuses; Forget ends all of an agent's
// connections. Both find a connection (a plain HTTP request: each is its
// own) in one place, its agentConn, from the moment its agent is known:
// while it is judged, dialled or waits for an approval as while its
// bytes move. Whatever moves them registers there as it starts
// (agentConn.moving): a relay, spliced or on the kernel path, judged by
// its destination; an intercepted connection, by its host; a plain HTTP
// request being forwarded (a long stream, an upgrade's tunnel), as it
// was judged, by its host, method, path, override methods and MCP
// messages (policy.DecideAgain), and so each request the Interceptor
// forwards, registered through the policy.InFlight in its context
// (TestPlainMCPCallEndsWhenItsToolIsRefused). It is judged
// again there, before a byte of it moves, by the policy as it is then,
// so that a change that came while it was judged (or while its client
// was silent) ends it too, recorded as refused; a forgotten one never
// starts (TestPolicyChangeWhileJudged, TestForgetWhileDialling,
// TestPolicyChangeWhileDialling, TestForgetEndsTheUpstreamToo,
// TestPlainHTTPEndsOnForgetAndRejudge,
// TestInterceptedEndsOnForgetAndRejudge,
// TestInterceptedRequestsEndOnForgetAndRejudge). What moves bytes is
// what the idle sweep and a forced Shutdown find too (mover): a relay; a
// plain HTTP request being forwarded (forwarding), idle while neither its
// body, its response nor its upgrade's tunnel moves; an intercepted
// connection, by the bytes that pass its client connection. An upgrade's
// tunnel, which the forwarder copies beneath every response writer,
// passes through one place of its own (upgraded): counted for its
// record, held to the agent's byte rate, and waited for by Shutdown. A
// plain request's heads, which net/http reads and writes beneath the
// bodies, are counted for its record (httpmeter) and, on the explicit
// proxy, held to the agent's byte rates (a transparent connection is held
// on the connection itself). What ends a plain request being forwarded
// (httpfwd.Client) ends its handler's reads and writes on the client
// too, which its context does not (a client that reads nothing, or a
// body that stops coming while it is judged); and net/http is not left
// to wait, after the handler, with no deadline and unseen, for what the
// handler left unread of a body. Shutdown waits for the explicit proxy's
// plain requests as for the transparent ones
// (TestPlainHTTPHeadsHeldAndCounted, TestEndedRequestWhoseClientStalls,
// TestForgottenWhileItsBodyIsRead, TestUnreadBodyDoesNotHoldTheConnection,
// TestShutdownWaitsForPlainRequests).
//
// The redirect rules that feed the transparent proxy are in the package
// nftrules (Linux only); tproxy itself builds on every OS.
//
// Typical use (ExampleProxy_ServeExplicit_allowed runs the explicit
// half):
//
//	p := &tproxy.Proxy{Agents: agents.Lookup, Names: dns.Names, Guard: guard, Resolver: dns, Interceptor: ic, Log: log}
//	go p.Serve(transparentListener)   // fed by nftrules
//	go p.ServeExplicit(explicitListener)
//	defer p.Shutdown(ctx)
//
// TLS that passes through is judged by its server name only: a CDN that
// routes by the Host inside the TLS (domain fronting) can carry a request
// for another site to an allowed name's servers. Allow shared fronts only
// with that in mind, or intercept them. Encrypted Client Hello, whose
// outer name is such a front by design, is refused.
//
// tproxy does not terminate TLS (mitm does) and does not resolve names for
// the sandbox (dnsfilter does).
package tproxy
