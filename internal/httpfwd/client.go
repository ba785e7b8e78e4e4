package httpfwd

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Client is a request's client as its handler waits on it, the one place
// the proxies end it: a request's context does not end a handler blocked
// in the client connection's calls (a write to a client that reads
// nothing, a read of a body that stopped coming). Stop ends them; it
// does nothing once the handler is done (Finish), when the connection
// may carry the next request.
type Client struct {
	mu       sync.Mutex
	w        http.ResponseWriter
	rc       *http.ResponseController
	http1    bool
	body     *endNotingBody // nil if the request has none
	bodyRead atomic.Bool    // the request's body was read to its end, or it has none
	// headWritten: the final response head is written (or being),
	// with the fields it goes with.
	headWritten atomic.Bool
	head        headWriter // the handler's writer, on a full-duplex request
	stopped     bool
	done        bool
}

// AnswerGrace is how long a handler has to write its own answer (a
// refusal) once its client was stopped (Answering).
const AnswerGrace = 5 * time.Second

// NewClient watches r's body for its end; w is the server's own writer.
// The handler answers on the writer it returns, which unwraps to w.
//
// An HTTP/1 request is made full duplex (HTTP/2's streams are): a
// forwarder reads the body as its upstream sends, and may send, the
// response, but net/http, at the response's first write, would read
// what remains of the body itself, and close it, beneath the forwarder.
// The forwarder's next read then failed, and its upstream connection
// with it, mid-response: a stream the upstream answered before the
// forwarder had seen the body's end was cut after its first bytes, and
// one answered before the body had all come stalled until it had. So
// net/http no longer keeps the connection in step with the next
// request: a response whose head is written before its request's body
// has been read to its end closes the connection after it (what remains
// of the body may never be read, and must not be taken for a request).
func NewClient(w http.ResponseWriter, r *http.Request) (*Client, http.ResponseWriter) {
	c := &Client{w: w, rc: http.NewResponseController(w), http1: r.ProtoMajor == 1}
	if r.Body == nil || r.Body == http.NoBody {
		c.bodyRead.Store(true)
	} else {
		c.body = &endNotingBody{ReadCloser: r.Body, ended: &c.bodyRead}
		r.Body = c.body
	}
	if !c.http1 {
		return c, w
	}
	if err := c.rc.EnableFullDuplex(); err != nil {
		// Not the server's writer: the half-duplex net/http keeps
		// the connection in step by itself.
		return c, w
	}
	c.head = headWriter{ResponseWriter: w, c: c}
	return c, &c.head
}

// Stop ends the handler's reads and writes on the client connection (or,
// on HTTP/2, its stream) at once.
func (c *Client) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.stopped = true
		now := time.Now()
		c.rc.SetReadDeadline(now)
		c.rc.SetWriteDeadline(now)
	}
}

// Answering lets a handler whose client was stopped write its own answer
// (a refusal: the request was ended before it was forwarded) within
// AnswerGrace, on a connection then closed: the deadline Stop set would
// fail the answer, and one left set would fail the next request's.
func (c *Client) Answering() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped && !c.done {
		c.rc.SetWriteDeadline(time.Now().Add(AnswerGrace))
		if c.http1 {
			c.w.Header().Set("Connection", "close")
		}
	}
}

// Finish is called as the handler returns. What remains of an HTTP/1
// body it did not read to its end is not waited for: net/http reads it
// after the handler, without a deadline, and where nothing that ends
// requests sees it. What of it has come is read, and the connection is
// closed after the response (heading). (A body read to its end is left
// alone: net/http then reads the connection itself, to notice its
// client leave, and a deadline would end the connection.) A read of the
// body still under way (the forwarder's, whose upstream answered
// without waiting for the body) is waited for, ended by the deadline,
// and none comes after it: net/http, finding a read under way as the
// handler returns, would wait for it itself and then clear the
// deadline, and read the rest without.
func (c *Client) Finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	if c.http1 && !c.bodyRead.Load() {
		c.heading(c.w.Header()) // net/http writes the head of a handler that wrote none
		c.rc.SetReadDeadline(time.Now())
		if c.body != nil {
			c.body.finish()
		}
	}
}

// heading is called as a final response head is written, with its
// fields: the connection is closed after a response whose request's
// body was not read to its end.
func (c *Client) heading(h http.Header) {
	if c.headWritten.Load() || c.headWritten.Swap(true) { // a load on every later write, no store
		return
	}
	if !c.bodyRead.Load() {
		h.Set("Connection", "close")
	}
}

// headWriter is the handler's writer on a full-duplex HTTP/1 request:
// it sees the response head go. It unwraps for http.ResponseController.
type headWriter struct {
	http.ResponseWriter
	c *Client
}

func (w *headWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols { // not an interim head
		w.c.heading(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headWriter) Write(b []byte) (int, error) {
	w.c.heading(w.Header())
	return w.ResponseWriter.Write(b)
}

func (w *headWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// endNotingBody notes when its body has been read to its end. Once its
// handler has returned (finish), it is read no more.
type endNotingBody struct {
	io.ReadCloser
	ended    *atomic.Bool
	reading  sync.Mutex // held while a read is under way
	finished bool
}

// errHandlerDone fails a read of a body whose handler has returned.
var errHandlerDone = errors.New("httpfwd: the request's handler has returned")

// finish waits for a read under way to return, and fails those to come.
func (b *endNotingBody) finish() {
	b.reading.Lock()
	defer b.reading.Unlock()
	b.finished = true
}

func (b *endNotingBody) Read(p []byte) (int, error) {
	b.reading.Lock()
	defer b.reading.Unlock()
	if b.finished {
		return 0, errHandlerDone
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.ended.Store(true)
	}
	return n, err
}
