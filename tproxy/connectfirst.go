package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// connectReply answers a CONNECT: a refusal, or the connection itself,
// with what the client sent after its request head, once the upstream is
// in hand. net/http's ResponseWriter is one (httpReply); the proxy's own
// reading of a connection's first request is the other (rawReply).
type connectReply interface {
	refuse(a answer)
	hijack() (net.Conn, *bufio.Reader, error)
	// whileWaiting has the request's context end if the client goes,
	// until stop is called.
	whileWaiting() (stop func())
}

// httpReply answers a CONNECT that net/http read.
type httpReply struct{ w http.ResponseWriter }

func (h httpReply) refuse(a answer) { a.write(h.w) }

// whileWaiting needs no watcher: net/http ends the request's context
// when its client goes.
func (h httpReply) whileWaiting() (stop func()) { return func() {} }

func (h httpReply) hijack() (net.Conn, *bufio.Reader, error) {
	c, brw, err := http.NewResponseController(h.w).Hijack()
	if err != nil {
		return nil, nil, err
	}
	return c, brw.Reader, nil
}

// maxRequestHead bounds a request head the proxy reads itself, as
// net/http's MaxHeaderBytes (newHTTPServer) bounds its own, with its
// slack for the request line.
const maxRequestHead = 64<<10 + 4096

// serveConnectFirst reads c's first request head. A CONNECT it serves
// itself (serveConnect, with a rawReply), so that a tunnel opened by a
// client's first request never pays for net/http's machinery per
// connection (its goroutine that reads ahead, its buffers, its contexts).
// Any other request goes to net/http as it came (handed), as soon as its
// first bytes are not "CONNECT ", with the bytes read so far replayed,
// bounded there as it was here, and held to the hello timeout that began
// here. A client silent (or gone) before it sends a byte is closed, as
// net/http closes one whose head does not come within the hello timeout;
// a CONNECT's head must come whole within it too. The request's context
// ends when Shutdown comes, or (while an approval is awaited) when the
// client goes.
func (p *Proxy) serveConnectFirst(c net.Conn, handed *connQueue) {
	ctx, cancel := context.WithCancel(p.baseCtx)
	defer cancel()
	if !p.trackPending(c, cancel) {
		p.releaseExplicit(c)
		reset(c)
		return
	}
	head := &io.LimitedReader{R: c, N: maxRequestHead}
	br := bufio.NewReader(head)
	helloBy := time.Now().Add(orDefault(p.HelloTimeout, DefaultHelloTimeout))
	c.SetReadDeadline(helloBy)
	if !isConnect(br) {
		c.SetReadDeadline(time.Time{})
		p.untrackPending(c)
		if br.Buffered() == 0 { // nothing came: nothing to answer
			p.releaseExplicit(c)
			c.Close()
			return
		}
		prefix, _ := br.Peek(br.Buffered())
		hc := &handedConn{prefixConn: newPrefixConn(c, bytes.Clone(prefix)), by: helloBy}
		hc.SetReadDeadline(time.Time{})
		p.moveCount(c, hc)
		if !handed.push(hc) {
			p.releaseExplicit(hc)
			reset(c)
		}
		return
	}
	r, err := http.ReadRequest(br)
	c.SetReadDeadline(time.Time{})
	reply := &rawReply{p: p, c: c, br: br, cancel: cancel}
	switch {
	case err != nil && head.N == 0:
		reply.refuse(answer{status: http.StatusRequestHeaderFieldsTooLarge, errType: "http_request_error", why: "request head too large", refused: true})
		return
	case err != nil:
		reply.refuse(answer{status: http.StatusBadRequest, errType: "http_request_error", why: "malformed request: " + err.Error(), refused: true})
		return
	}
	if status, why := invalidHead(r); status != 0 {
		reply.refuse(answer{status: status, errType: "http_request_error", why: why, refused: true})
		return
	}
	ctx = context.WithValue(ctx, http.LocalAddrContextKey, c.LocalAddr())
	ctx = context.WithValue(ctx, factsKey{}, connFacts{src: addrPortOf(c.RemoteAddr()), explicit: true})
	p.serveConnect(reply, r.WithContext(ctx))
	if !reply.hijacked {
		reply.close()
	}
}

// isConnect reads from br until its bytes are "CONNECT " or cannot
// become it (at once for a client that sends "GET /" and waits), or its
// reads fail.
func isConnect(br *bufio.Reader) bool {
	const method = "CONNECT "
	for n := 1; n <= len(method); n++ {
		if b, err := br.Peek(n); err != nil || b[n-1] != method[n-1] {
			return false
		}
	}
	return true
}

// invalidHead is what net/http's server refuses in a request head that
// http.ReadRequest accepts, with its status: a version other than 1.x,
// more than one Host, an invalid Host, invalid header field names and
// values, an expectation other than 100-continue.
func invalidHead(r *http.Request) (int, string) {
	if r.ProtoMajor != 1 {
		return http.StatusHTTPVersionNotSupported, "unsupported protocol version"
	}
	hosts := r.Header["Host"]
	switch {
	case len(hosts) > 1:
		return http.StatusBadRequest, "too many Host headers"
	case len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]):
		return http.StatusBadRequest, "malformed Host header"
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return http.StatusBadRequest, "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return http.StatusBadRequest, "invalid header value"
			}
		}
	}
	if e := r.Header["Expect"]; len(e) > 0 && !httpguts.HeaderValuesContainsToken(e, "100-continue") {
		return http.StatusExpectationFailed, "unsupported Expect"
	}
	return 0, ""
}

// handedConn is a connection handed to net/http after its first bytes
// were read here: until net/http has read the first request head
// (unclamp, at StateActive), no read deadline it sets goes past the
// hello timeout that began when the connection was accepted, so that a
// head dripped to net/http does not get a second timeout.
type handedConn struct {
	*prefixConn
	mu    sync.Mutex
	by    time.Time // zero once unclamped
	asked time.Time // the read deadline last asked for
}

func (c *handedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = t
	if !c.by.IsZero() && (t.IsZero() || t.After(c.by)) {
		t = c.by
	}
	return c.prefixConn.SetReadDeadline(t)
}

func (c *handedConn) SetDeadline(t time.Time) error {
	if err := c.prefixConn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// unclamp lets read deadlines be as net/http asks, the one it asked last
// first.
func (c *handedConn) unclamp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by.IsZero() {
		return
	}
	c.by = time.Time{}
	c.prefixConn.SetReadDeadline(c.asked)
}

// rawReply answers a CONNECT the proxy read itself, on its connection: a
// refusal as an HTTP/1.1 response that closes the connection, or the
// connection, which from then on counts as its agent's.
type rawReply struct {
	p        *Proxy
	c        net.Conn
	br       *bufio.Reader
	cancel   context.CancelFunc // ends the request's context
	hijacked bool
}

func (rr *rawReply) refuse(a answer) {
	var w bufferedResponse
	a.write(&w)
	resp := &http.Response{
		StatusCode: w.status, ProtoMajor: 1, ProtoMinor: 1, Header: w.header,
		Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Close: true,
	}
	if resp.StatusCode == 0 { // an answer that wrote nothing is still a refusal
		resp.StatusCode = http.StatusInternalServerError
	}
	rr.c.SetWriteDeadline(time.Now().Add(orDefault(rr.p.HelloTimeout, DefaultHelloTimeout)))
	resp.Write(rr.c)
	rr.close()
}

func (rr *rawReply) hijack() (net.Conn, *bufio.Reader, error) {
	rr.hijacked = true
	rr.p.untrackPending(rr.c)
	rr.p.releaseExplicit(rr.c)
	return rr.c, rr.br, nil
}

// whileWaiting ends the request's context if the client goes (its
// end, or a reset) before stop is called. It is asked for only around a
// wait that nothing else bounds (an approval), so that a tunnel's
// ordinary path pays for no watcher. It waits for the client's first
// byte; once bytes wait (a client that spoke ahead of its answer, whose
// end a peek no longer shows), it asks the socket's state every
// goneEvery, where the system can say (clientGone), so that a client
// gone after one byte does not keep its approval waiting.
func (rr *rawReply) whileWaiting() (stop func()) {
	done, stopping := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		gone, err := awaitBytes(rr.c)
		for err == nil && !gone {
			select {
			case <-stopping:
				return
			case <-time.After(goneEvery):
			}
			gone, err = clientGone(rr.c)
		}
		if gone && err == nil {
			rr.cancel()
		}
	}()
	return func() {
		close(stopping)
		rr.c.SetReadDeadline(time.Unix(1, 0))
		<-done
		rr.c.SetReadDeadline(time.Time{})
	}
}

// goneEvery is how often whileWaiting asks whether a client that spoke
// ahead is still there.
const goneEvery = 100 * time.Millisecond

// close ends a connection that was not hijacked.
func (rr *rawReply) close() {
	rr.p.untrackPending(rr.c)
	rr.p.releaseExplicit(rr.c)
	rr.c.Close()
}

// bufferedResponse is an http.ResponseWriter that keeps what an answer
// writes, for rawReply to send.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *bufferedResponse) Header() http.Header {
	if w.header == nil {
		w.header = http.Header{}
	}
	return w.header
}

func (w *bufferedResponse) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *bufferedResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// trackPending counts c among the connections whose first request the
// proxy reads itself, which Shutdown closes, ending their requests'
// contexts (cancel); false once it is closed.
func (p *Proxy) trackPending(c net.Conn, cancel context.CancelFunc) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.pending[c] = cancel
	return true
}

func (p *Proxy) untrackPending(c net.Conn) {
	p.mu.Lock()
	delete(p.pending, c)
	p.mu.Unlock()
}
