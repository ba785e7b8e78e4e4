package tproxy

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// forwarding is a plain HTTP request being forwarded, as the idle sweep
// and a forced shutdown find it: idle while nothing of it moves, its
// body, its response, or, once its upstream switched protocols, its
// tunnel (upgraded).
type forwarding struct {
	lastActive atomic.Int64 // Unix nanoseconds
	// end ends the request, saying why (its ending).
	end func(why string)
}

func newForwarding(end func(why string)) *forwarding {
	f := &forwarding{end: end}
	f.touch()
	return f
}

// touch notes that bytes of the request moved.
func (f *forwarding) touch() { f.lastActive.Store(time.Now().UnixNano()) }

func (f *forwarding) idle() time.Duration {
	return time.Since(time.Unix(0, f.lastActive.Load()))
}

func (f *forwarding) abort(why string) { f.end(why) }

// watch returns w and r's body as the forwarder is to use them, each
// noting f's activity as its bytes move.
func (f *forwarding) watch(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &touchingBody{ReadCloser: r.Body, f: f}
	}
	return &touchingWriter{ResponseWriter: w, f: f}
}

type touchingBody struct {
	io.ReadCloser
	f *forwarding
}

func (b *touchingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.f.touch()
	}
	return n, err
}

// touchingWriter unwraps for http.ResponseController, so that flushing
// and hijacking reach the writer beneath.
type touchingWriter struct {
	http.ResponseWriter
	f *forwarding
}

func (w *touchingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	if n > 0 {
		w.f.touch()
	}
	return n, err
}

func (w *touchingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
