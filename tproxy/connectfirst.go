package tproxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
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
}

// httpReply answers a CONNECT that net/http read.
type httpReply struct{ w http.ResponseWriter }

func (h httpReply) refuse(a answer) { a.write(h.w) }

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
// Any other request goes to net/http as it came (handed), with the
// bytes read so far replayed, and is bounded there as it was here. A
// client silent (or gone) before its method is read is closed, as
// net/http closes one whose head does not come within the hello timeout:
// a CONNECT's head must come whole within it too.
func (p *Proxy) serveConnectFirst(c net.Conn, handed *connQueue) {
	if !p.trackPending(c) {
		p.releaseExplicit(c)
		reset(c)
		return
	}
	head := &io.LimitedReader{R: c, N: maxRequestHead}
	br := bufio.NewReader(head)
	c.SetReadDeadline(time.Now().Add(orDefault(p.HelloTimeout, DefaultHelloTimeout)))
	method, err := br.Peek(len("CONNECT "))
	if err != nil {
		(&rawReply{p: p, c: c}).close()
		return
	}
	if string(method) != "CONNECT " {
		c.SetReadDeadline(time.Time{})
		p.untrackPending(c)
		prefix, _ := br.Peek(br.Buffered())
		pc := newPrefixConn(c, bytes.Clone(prefix))
		p.moveCount(c, pc)
		if !handed.push(pc) {
			p.releaseExplicit(pc)
			reset(c)
		}
		return
	}
	r, err := http.ReadRequest(br)
	c.SetReadDeadline(time.Time{})
	reply := &rawReply{p: p, c: c, br: br}
	switch {
	case err != nil && head.N == 0:
		reply.refuse(answer{status: http.StatusRequestHeaderFieldsTooLarge, errType: "http_request_error", why: "request head too large", refused: true})
		return
	case err != nil:
		reply.refuse(answer{status: http.StatusBadRequest, errType: "http_request_error", why: "malformed request: " + err.Error(), refused: true})
		return
	}
	if why := invalidHead(r); why != "" {
		reply.refuse(answer{status: http.StatusBadRequest, errType: "http_request_error", why: why, refused: true})
		return
	}
	ctx := context.WithValue(p.baseCtx, http.LocalAddrContextKey, c.LocalAddr())
	ctx = context.WithValue(ctx, factsKey{}, connFacts{src: addrPortOf(c.RemoteAddr()), explicit: true})
	p.serveConnect(reply, r.WithContext(ctx))
	if !reply.hijacked {
		reply.close()
	}
}

// invalidHead is what net/http's server refuses in a request head that
// http.ReadRequest accepts: more than one Host, an invalid Host, invalid
// header field names and values.
func invalidHead(r *http.Request) string {
	hosts := r.Header["Host"]
	switch {
	case len(hosts) > 1:
		return "too many Host headers"
	case len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]):
		return "malformed Host header"
	}
	for k, vv := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "invalid header value"
			}
		}
	}
	return ""
}

// rawReply answers a CONNECT the proxy read itself, on its connection: a
// refusal as an HTTP/1.1 response that closes the connection, or the
// connection, which from then on counts as its agent's.
type rawReply struct {
	p        *Proxy
	c        net.Conn
	br       *bufio.Reader
	hijacked bool
}

func (rr *rawReply) refuse(a answer) {
	var w bufferedResponse
	a.write(&w)
	resp := &http.Response{
		StatusCode: w.status, ProtoMajor: 1, ProtoMinor: 1, Header: w.header,
		Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Close: true,
	}
	if resp.StatusCode == 0 {
		resp.StatusCode = http.StatusOK
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
// proxy reads itself, which Shutdown closes; false once it is closed.
func (p *Proxy) trackPending(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.pending[c] = struct{}{}
	return true
}

func (p *Proxy) untrackPending(c net.Conn) {
	p.mu.Lock()
	delete(p.pending, c)
	p.mu.Unlock()
}
