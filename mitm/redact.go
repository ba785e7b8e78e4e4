package mitm

import (
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/agenthold/egress/internal/redact"
)

// Replacer finds the values of secrets and puts placeholders in their
// place, in strings and in streams. It is immutable and safe for
// concurrent use; build one with [NewReplacer].
type Replacer = redact.Replacer

// Replacement is one string to find (a secret's value, in one form) and
// what the sandbox sees instead (its placeholder, in the same form).
type Replacement = redact.Pair

// NewReplacer compiles the replacements; an empty Find, or one equal to
// its Replace, is dropped.
func NewReplacer(rs ...Replacement) *Replacer { return redact.New(rs) }

// SecretForms lists the replacements of value by placeholder in the
// forms an echo commonly takes: raw (and upper- and lower-cased),
// JSON-escaped, URL-encoded (query and path), hex, and base64 at each
// alignment (redact.Forms says which are not). A custom [Redactor]
// builds its Replacer from these.
func SecretForms(value, placeholder string) []Replacement { return redact.Forms(value, placeholder) }

// Redactor gives, for an exchange of an agent with host, the replacer
// that puts the agent's placeholders back wherever the response echoes
// the value of a secret that could have been sent there; vault.Vault
// implements it. Nil means nothing to redact; an error means the response
// must not reach the sandbox.
type Redactor interface {
	Redactor(agent, host string) (*Replacer, error)
}

// NoRedaction is the Redactor of an Interceptor whose Injector sends
// nothing an echo could betray (a constant header, say): it says so
// explicitly, since an Interceptor with an Injector and no Redactor
// refuses every connection.
var NoRedaction Redactor = noRedaction{}

type noRedaction struct{}

func (noRedaction) Redactor(string, string) (*Replacer, error) { return nil, nil }

// ErrNoRedactor refuses the connections of an Interceptor with an
// Injector that cannot redact and no Redactor.
var ErrNoRedactor = errors.New("mitm: an Injector without a Redactor: echoes of its secrets would reach the sandbox (set Interceptor.Redactor, or NoRedaction)")

// One writer stands between the upstream and the sandbox in an exchange
// that could carry a secret: redactingWriter. What the reverse proxy,
// a hook or an error page writes reaches the sandbox only through it:
// the status line's headers, 1xx headers, the body as it streams (held
// back only where a value may begin), the trailers (HTTP/1.1 chunked and
// HTTP/2, announced or not), and the fields that would reveal a length
// are dropped. The one exit from HTTP, a protocol upgrade, has its
// response head redacted in modifyResponse and its frames from the
// server by a frame redactor (websocket.go), since the reverse proxy
// writes both on the hijacked connection. The request asks for the
// identity encoding and no range, since a compressed or partial body
// hides what it holds; a server that compresses anyway has gzip and
// deflate decoded here, and any other encoding refused.

// prepareResponse readies for redaction what the upstream answered; the
// error refuses the response.
func prepareResponse(resp *http.Response, red, wsSub *Replacer) error {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		redactHeader(resp.Header, red)
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return fmt.Errorf("upgraded connection is not readable and writable")
		}
		resp.Body = newFrameRedactor(rwc, red, wsSub)
		return nil
	}
	body, err := decoded(resp)
	if err != nil {
		return err
	}
	resp.Body = readCloser{body, resp.Body}
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
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
	// The errors name no coding: the upstream chose them, and it may echo
	// what the request carried.
	if len(codings) > 1 {
		return nil, errors.New("the response is in more than one encoding, which the gateway cannot read to keep secrets out of it")
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
		return nil, errors.New("the response is in an encoding other than gzip and deflate, which the gateway cannot read to keep secrets out of it")
	}
}

// redactHeader redacts h in place, as redactedFields does.
func redactHeader(h http.Header, red *Replacer) {
	for k, vals := range h {
		if vals, ok := redactedFields(red, k, vals); ok {
			h[k] = vals
		} else {
			delete(h, k)
		}
	}
}

// redactedFields is the one judge of a response's header and trailer
// fields: their values redacted, and ok false for a field to drop, whose
// name holds a secret's value in any form, or whose values still do in
// another letter case once redacted. A name is not redacted but dropped:
// field names are matched without regard to case, and net/http changes
// theirs (an echo of a query key as a field name comes back
// capitalised), so no form of the value matches it as it stands.
func redactedFields(red *Replacer, name string, vals []string) (out []string, ok bool) {
	if red.ContainsFold(name) {
		return nil, false
	}
	out = make([]string, len(vals))
	for i, v := range vals {
		if out[i] = red.String(v); red.ContainsFold(out[i]) {
			return nil, false
		}
	}
	return out, true
}

// unseenFields would tell the sandbox the length (or a digest) of a
// body whose secrets were replaced: dropped wherever redaction applies.
var unseenFields = []string{"Content-Length", "Content-Range", "Content-Md5", "Digest", "Content-Digest", "Repr-Digest"}

// redactingWriter is the one writer between the upstream (or a hook)
// and the sandbox of an exchange that could carry a secret. Its handler
// writes headers into a map of its own, which reaches the sandbox only
// redacted; the body is redacted as it streams and gathered into larger
// writes (a chunk per 16 KiB TLS record from upstream would cost a small
// TLS record and a system call each); Flush, which the reverse proxy
// calls for streams, writes at once, so streams keep their pace.
type redactingWriter struct {
	w     http.ResponseWriter // the sandbox's
	h     http.Header
	red   *Replacer
	s     *redact.Stream
	wrote bool
	buf   []byte
}

var errFinished = errors.New("mitm: write after the response was finished")

// writeBuffers are redactingWriter's buffers, reused across requests.
var writeBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

func newRedactingWriter(w http.ResponseWriter, red *Replacer) *redactingWriter {
	return &redactingWriter{w: w, h: make(http.Header), red: red, s: red.Stream(), buf: (*writeBuffers.Get().(*[]byte))[:0]}
}

func (w *redactingWriter) Header() http.Header { return w.h }

// WriteHeader sends the headers as they stand, redacted: for an
// informational response (103 Early Hints, say) as for the final one.
func (w *redactingWriter) WriteHeader(code int) {
	if w.wrote {
		return
	}
	out := w.w.Header()
	clear(out)
	for k, vals := range w.h {
		if vals, ok := redactedFields(w.red, k, vals); ok {
			out[k] = vals
		}
	}
	for _, k := range unseenFields {
		out.Del(k)
	}
	if code >= http.StatusOK {
		w.wrote = true
	}
	w.w.WriteHeader(code)
}

func (w *redactingWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.buf == nil {
		return 0, errFinished
	}
	w.buf = w.s.Feed(w.buf, b)
	if len(w.buf) >= cap(w.buf)/2 {
		if err := w.writeOut(); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (w *redactingWriter) writeOut() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Flush writes what is certain (a possible start of a value stays held)
// and flushes the connection.
func (w *redactingWriter) Flush() {
	w.FlushError()
}

// FlushError is Flush, with the error.
func (w *redactingWriter) FlushError() error {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if err := w.writeOut(); err != nil {
		return err
	}
	return http.NewResponseController(w.w).Flush()
}

// finish writes what the stream held back and the trailers, redacted,
// and gives the buffer back, once the handler is done. (When it aborted
// the response, what finish writes is dropped with the connection or
// stream; what the stream held is redacted as it stands in any case.)
func (w *redactingWriter) finish() {
	if w.buf == nil {
		return
	}
	if w.wrote {
		w.buf = w.s.Flush(w.buf)
		w.writeOut()
		w.trailers()
	}
	b := w.buf[:0]
	w.buf = nil
	writeBuffers.Put(&b)
}

// trailers copies the trailers the handler set, redacted, to the
// sandbox's header map, where net/http sends them after the body: those
// announced in the Trailer header, and those set with
// http.TrailerPrefix (HTTP/2 trailers nobody announced, as gRPC's).
func (w *redactingWriter) trailers() {
	out := w.w.Header()
	for _, v := range w.h.Values("Trailer") {
		for k := range strings.SplitSeq(v, ",") {
			k = http.CanonicalHeaderKey(strings.TrimSpace(k))
			if vals, ok := w.h[k]; ok && k != "" {
				if vals, ok := redactedFields(w.red, k, vals); ok {
					out[k] = vals
				}
			}
		}
	}
	for k, vals := range w.h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			if vals, ok := redactedFields(w.red, k, vals); ok {
				out[k] = vals
			}
		}
	}
}

func (w *redactingWriter) Unwrap() http.ResponseWriter { return w.w }
