// Package httpmeter counts what an HTTP handler moves, for the request
// records of the proxies: the status and the bytes written, head and
// body, and the bytes of the request, head and body. A head is counted as
// HTTP/1.1 writes it (HeadSize, ResponseHeadSize), whatever framing
// carried it (HTTP/2 compresses it).
package httpmeter

import (
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
)

// HeadSize is the size of r's head as HTTP/1.1 writes it: its request
// line, Host and header fields. net/http keeps Host apart from the
// header fields, and drops the framing ones it reads (Content-Length,
// Transfer-Encoding), which weigh a few bytes.
func HeadSize(r *http.Request) int64 {
	uri := r.RequestURI
	if uri == "" && r.URL != nil {
		uri = r.URL.RequestURI()
	}
	n := len(r.Method) + 1 + len(uri) + 1 + len(r.Proto) + 2
	if r.Host != "" {
		n += len("Host: ") + len(r.Host) + 2
	}
	return int64(n) + fieldsSize(r.Header) + 2
}

// ResponseHeadSize is the size of a response head with status code and
// header h as HTTP/1.1 writes it.
func ResponseHeadSize(code int, h http.Header) int64 {
	n := len("HTTP/1.1 ") + len(strconv.Itoa(code)) + 1 + len(http.StatusText(code)) + 2
	return int64(n) + fieldsSize(h) + 2
}

func fieldsSize(h http.Header) int64 {
	var n int64
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + 2 + len(v) + 2)
		}
	}
	return n
}

// Writer records the status and counts the bytes written: each head
// (informational ones too) and the body. It unwraps for
// http.ResponseController, so that flushing and hijacking (WebSocket
// upgrades) reach the real writer.
type Writer struct {
	http.ResponseWriter
	Status int
	Bytes  int64
}

// WriteHeader implements http.ResponseWriter.
func (w *Writer) WriteHeader(code int) {
	if w.Status == 0 || w.Status < 200 {
		w.Status = code
		w.Bytes += ResponseHeadSize(code, w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter. A body written before any head
// writes the head of 200, as net/http does, explicitly: so that writers
// beneath see it too.
func (w *Writer) Write(b []byte) (int, error) {
	if w.Status == 0 || w.Status < 200 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.Bytes += int64(n)
	return n, err
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Request counts a request's bytes: its head, and the bytes read from its
// body; the count may be read while the body is read in another
// goroutine.
type Request struct {
	io.ReadCloser
	n atomic.Int64
}

// CountRequest counts r's head, wraps its body, if it has one, and
// returns the counter.
func CountRequest(r *http.Request) *Request {
	c := &Request{ReadCloser: r.Body}
	c.n.Store(HeadSize(r))
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = c
	}
	return c
}

func (c *Request) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Bytes reports the bytes of the request so far.
func (c *Request) Bytes() int64 { return c.n.Load() }
