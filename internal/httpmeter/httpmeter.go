// Package httpmeter counts what an HTTP handler moves, for the request
// records of the proxies: the status and body bytes written, and the
// request body bytes read.
package httpmeter

import (
	"io"
	"net/http"
	"sync/atomic"
)

// Writer records the status and counts the body bytes written. It unwraps
// for http.ResponseController, so that flushing and hijacking (WebSocket
// upgrades) reach the real writer.
type Writer struct {
	http.ResponseWriter
	Status int
	Bytes  int64
}

// WriteHeader implements http.ResponseWriter.
func (w *Writer) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *Writer) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.Bytes += int64(n)
	return n, err
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Body counts the bytes read from a request body; the count may be read
// while the body is read in another goroutine.
type Body struct {
	io.ReadCloser
	n atomic.Int64
}

// CountBody wraps r's body, if it has one, and returns the counter.
func CountBody(r *http.Request) *Body {
	b := &Body{ReadCloser: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = b
	}
	return b
}

func (b *Body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// Bytes reports the bytes read so far.
func (b *Body) Bytes() int64 { return b.n.Load() }
