package mitm

import (
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/agenthold/egress/internal/redact"
)

// Redactor gives, for an exchange of an agent with host, the replacer
// that puts the agent's placeholders back wherever the response echoes
// the value of a secret that could have been sent there; vault.Vault
// implements it. Nil means nothing to redact; an error means the response
// must not reach the sandbox.
type Redactor interface {
	Redactor(agent, host string) (*redact.Replacer, error)
}

// Responses to a request that carried a secret are redacted: the headers
// and trailers, the body as it streams (held back only where a value may
// begin), and the frames of a WebSocket from the server. The request asks
// for the identity encoding, since a compressed body hides what it holds;
// a server that compresses anyway has gzip and deflate decoded here, and
// any other encoding refused.

// redactResponse redacts what the upstream answered; the error refuses
// the response.
func redactResponse(resp *http.Response, red, wsSub *redact.Replacer) error {
	redactHeader(resp.Header, red)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return fmt.Errorf("upgraded connection is not readable and writable")
		}
		resp.Body = newFrameRedactor(rwc, red, wsSub)
		return nil
	}
	if resp.Request.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		return nil
	}
	body, err := decoded(resp)
	if err != nil {
		return err
	}
	// A value and its placeholder differ in length, so the length is
	// known only at the end: the body goes out chunked. (ContentLength
	// stays: ReverseProxy reads it to choose when to flush, and a body of
	// known length need not be flushed write by write.)
	resp.Header.Del("Content-Length")
	resp.Body = &redactedBody{r: red.Reader(body), c: resp.Body, trailer: resp.Trailer, red: red}
	return nil
}

// decoded is the response's body in the identity encoding.
func decoded(resp *http.Response) (io.Reader, error) {
	// Every value of every Content-Encoding line counts: one encoding at
	// most, or the body is not readable here.
	var codings []string
	for _, v := range resp.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" { // not a name: a content coding
				codings = append(codings, c)
			}
		}
	}
	if len(codings) > 1 {
		return nil, fmt.Errorf("the response is in encodings %q, which the gateway cannot read to keep secrets out of it", codings)
	}
	ce := ""
	if len(codings) == 1 {
		ce = codings[0]
	}
	switch ce {
	case "":
		resp.Header.Del("Content-Encoding")
		return resp.Body, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("gzip body: %w", err)
		}
		resp.Header.Del("Content-Encoding")
		return zr, nil
	case "deflate":
		zr, err := zlib.NewReader(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("deflate body: %w", err)
		}
		resp.Header.Del("Content-Encoding")
		return zr, nil
	default:
		return nil, fmt.Errorf("the response is in %q encoding, which the gateway cannot read to keep secrets out of it", ce)
	}
}

func redactHeader(h http.Header, red *redact.Replacer) {
	for k, vals := range h {
		for i, v := range vals {
			h[k][i] = red.String(v)
		}
	}
}

// redactedBody is a response body read through the redactor; at its end
// the trailers, which arrive after the body, are redacted too.
type redactedBody struct {
	r       io.Reader
	c       io.Closer
	trailer http.Header
	red     *redact.Replacer
	done    bool
}

func (b *redactedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		redactHeader(b.trailer, b.red)
	}
	return n, err
}

func (b *redactedBody) Close() error { return b.c.Close() }

// redactingWriter is a ResponseWriter whose headers and body are
// redacted: for responses made at the gateway (hooks).
type redactingWriter struct {
	http.ResponseWriter
	s       *redact.Stream
	red     *redact.Replacer
	wrote   bool
	scratch []byte
}

func newRedactingWriter(w http.ResponseWriter, red *redact.Replacer) *redactingWriter {
	return &redactingWriter{ResponseWriter: w, s: red.Stream(), red: red}
}

func (w *redactingWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		redactHeader(w.Header(), w.red)
		w.Header().Del("Content-Length")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *redactingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.scratch = w.s.Feed(w.scratch[:0], b)
	if _, err := w.ResponseWriter.Write(w.scratch); err != nil {
		return 0, err
	}
	return len(b), nil
}

// finish writes what the stream held back.
func (w *redactingWriter) finish() {
	if !w.wrote {
		return
	}
	if rest := w.s.Flush(nil); len(rest) > 0 {
		w.ResponseWriter.Write(rest)
	}
}

func (w *redactingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bufferedWriter gathers a redacted body's writes into larger ones: a
// redacted body goes out chunked (its length is not known beforehand), and
// a chunk per 16 KiB TLS record read from upstream would cost a small TLS
// record and a system call each. Flush (which ReverseProxy calls for
// streams) writes at once, so streams keep their pace.
type bufferedWriter struct {
	http.ResponseWriter
	buf []byte
	red *redact.Replacer // for informational (1xx) headers, which ReverseProxy passes on itself
}

// writeBuffers are bufferedWriter's buffers, reused across requests.
var writeBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func newBufferedWriter(w http.ResponseWriter, red *redact.Replacer) *bufferedWriter {
	return &bufferedWriter{ResponseWriter: w, buf: (*writeBuffers.Get().(*[]byte))[:0], red: red}
}

// WriteHeader redacts an informational response's headers (103 Early
// Hints, say), which never pass through modifyResponse.
func (w *bufferedWriter) WriteHeader(code int) {
	if code < http.StatusOK {
		redactHeader(w.Header(), w.red)
	}
	w.ResponseWriter.WriteHeader(code)
}

// finish writes what is gathered and gives the buffer back.
func (w *bufferedWriter) finish() {
	w.writeOut()
	b := w.buf[:0]
	w.buf = nil
	writeBuffers.Put(&b)
}

func (w *bufferedWriter) Write(b []byte) (int, error) {
	if w.buf == nil { // finished: a late write goes straight out
		return w.ResponseWriter.Write(b)
	}
	if len(w.buf)+len(b) > cap(w.buf) {
		if err := w.writeOut(); err != nil {
			return 0, err
		}
		if len(b) >= cap(w.buf) {
			return w.ResponseWriter.Write(b)
		}
	}
	w.buf = append(w.buf, b...)
	return len(b), nil
}

func (w *bufferedWriter) writeOut() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.ResponseWriter.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Flush writes what is gathered and flushes the connection.
func (w *bufferedWriter) Flush() {
	w.FlushError()
}

// FlushError is Flush, with the error.
func (w *bufferedWriter) FlushError() error {
	if err := w.writeOut(); err != nil {
		return err
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *bufferedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
