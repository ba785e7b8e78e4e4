package httpfwd

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Client is a request's client as its handler waits on it, the one place
// the proxies end it: a request's context does not end a handler blocked
// in the client connection's calls (a write to a client that reads
// nothing, a read of a body that stopped coming: the forwarder's, or
// net/http's, which reads what remains of a body before it writes a
// response head). Stop ends them; it does nothing once the handler is
// done (Finish), when the connection may carry the next request.
type Client struct {
	mu       sync.Mutex
	w        http.ResponseWriter
	rc       *http.ResponseController
	http1    bool
	bodyRead atomic.Bool // the request's body was read to its end, or it has none
	stopped  bool
	done     bool
}

// AnswerGrace is how long a handler has to write its own answer (a
// refusal) once its client was stopped (Answering).
const AnswerGrace = 5 * time.Second

// NewClient watches r's body for its end; w is the server's own writer
// (or one that unwraps to it).
func NewClient(w http.ResponseWriter, r *http.Request) *Client {
	c := &Client{w: w, rc: http.NewResponseController(w), http1: r.ProtoMajor == 1}
	if r.Body == nil || r.Body == http.NoBody {
		c.bodyRead.Store(true)
	} else {
		r.Body = &endNotingBody{ReadCloser: r.Body, ended: &c.bodyRead}
	}
	return c
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
// after the handler, to keep the connection, without a deadline, and
// where nothing that ends requests sees it. What of it has come is read,
// and the connection is closed if more was to come. (A body read to its
// end is left alone: net/http then reads the connection itself, to
// notice its client leave, and a deadline would end the connection.)
func (c *Client) Finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	if c.http1 && !c.bodyRead.Load() {
		c.rc.SetReadDeadline(time.Now())
	}
}

// endNotingBody notes when its body has been read to its end.
type endNotingBody struct {
	io.ReadCloser
	ended *atomic.Bool
}

func (b *endNotingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.ended.Store(true)
	}
	return n, err
}
