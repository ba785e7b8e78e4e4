package mitm

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/vault"
)

// keyInjector is an adopter's own Injector: it puts the value in
// X-Api-Key where the request carries the placeholder. Its Redactor is
// built from the package's public replacer alone.
type keyInjector struct{ value, placeholder string }

func (k keyInjector) Inject(_ string, r *http.Request) ([]string, error) {
	if r.Header.Get("X-Api-Key") != k.placeholder {
		return nil, nil
	}
	r.Header.Set("X-Api-Key", k.value)
	return []string{"key"}, nil
}

type keyRedactor struct{ rep *Replacer }

func (k keyRedactor) Redactor(string, string) (*Replacer, error) { return k.rep, nil }

// encodings are the forms an echo takes in the table.
var encodings = map[string]func(string) string{
	"raw":    func(s string) string { return s },
	"json":   func(s string) string { b, _ := json.Marshal(map[string]string{"echo": s}); return string(b) },
	"url":    url.QueryEscape,
	"base64": func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
}

// receivedValue is the secret as the upstream received it, from either
// injector; sawValue notes that it did.
func receivedValue(req *http.Request, sawValue *atomic.Bool) string {
	v := req.Header.Get("X-Api-Key")
	if v == "" {
		v = strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
	}
	if v == secretValue {
		sawValue.Store(true)
	}
	return v
}

// tableEcho echoes the value it received, in the encoding X-Enc names,
// in the one part of its response X-Part names.
func tableEcho(sawValue *atomic.Bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		e := encodings[req.Header.Get("X-Enc")](receivedValue(req, sawValue))
		io.Copy(io.Discard, req.Body)
		grpc := req.Header.Get("Content-Type") == "application/grpc"
		if grpc {
			w.Header().Set("Content-Type", "application/grpc")
		}
		msg := func(s string) []byte {
			if grpc {
				return grpcFrame(s)
			}
			return []byte(s)
		}
		switch req.Header.Get("X-Part") {
		case "header":
			w.Header().Set("X-Echo", e)
		case "1xx":
			w.Header().Set("Link", "</hint?"+e+">; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
		case "body":
			w.Write(msg("echo: " + e + "\n"))
		case "split-body": // the value cut in two writes, flushed apart
			w.Write([]byte("echo: " + e[:len(e)/2]))
			http.NewResponseController(w).Flush()
			time.Sleep(10 * time.Millisecond)
			w.Write([]byte(e[len(e)/2:] + "\n"))
		case "trailer":
			w.Header().Set("Trailer", "X-Echo-Trailer")
			w.Write(msg("body\n"))
			w.Header().Set("X-Echo-Trailer", e)
		case "unannounced-trailer": // as gRPC servers send them
			w.Write(msg("body\n"))
			w.Header().Set(http.TrailerPrefix+"X-Echo-Trailer", e)
		}
		if grpc {
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
		}
	}
}

// seenOver is everything the sandbox received of one exchange: the
// informational responses' headers, the headers, the body and the
// trailers.
func seenOver(t *testing.T, c *http.Client, method, rawURL string, body []byte, header http.Header) string {
	t.Helper()
	var out strings.Builder
	req, err := http.NewRequest(method, rawURL, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header = header
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error { fmt.Fprintf(&out, "%d %v\n", code, h); return nil },
	}))
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	fmt.Fprintf(&out, "%s %v\n%s\n%v\n", resp.Status, resp.Header, b, resp.Trailer)
	return out.String()
}

// recordingConn keeps every byte the sandbox reads.
type recordingConn struct {
	net.Conn
	got bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.got.Write(p[:n])
	return n, err
}

// seenOverWebSocket is every byte the sandbox received over a WebSocket
// whose upstream echoes the value in part (the upgrade's headers, a
// text or a binary message), after TLS.
func seenOverWebSocket(t *testing.T, r *rig, addr string, header http.Header) string {
	t.Helper()
	cfg, err := websocket.NewConfig("wss://api.test/ws-table", "https://api.test/")
	require.NoError(t, err)
	cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
	cfg.Header = header
	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	tc := tls.Client(raw, cfg.TlsConfig)
	require.NoError(t, tc.Handshake())
	rec := &recordingConn{Conn: tc}
	ws, err := websocket.NewClient(cfg, rec)
	require.NoError(t, err)
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(5 * time.Second))
	require.NoError(t, websocket.Message.Send(ws, "go"))
	var msg []byte
	require.NoError(t, websocket.Message.Receive(ws, &msg))
	return rec.got.String()
}

// TestRedactionTable walks every part of a response that reaches the
// sandbox, over HTTP/1.1, HTTP/2, gRPC and WebSocket, with the value
// echoed raw, in JSON, URL-encoded and in base64, through the vault and
// through an adopter's own Injector and Redactor: the sandbox sees the
// placeholder, in the same encoding, and never the value.
func TestRedactionTable(t *testing.T) {
	var sawValue atomic.Bool
	r := newRig(t)
	r.mux.HandleFunc("/table", tableEcho(&sawValue))
	r.mux.HandleFunc("/table.Echo/Call", tableEcho(&sawValue))
	r.mux.Handle("/ws-table", websocket.Server{
		Handshake: func(cfg *websocket.Config, req *http.Request) error {
			if req.Header.Get("X-Part") == "upgrade-header" {
				cfg.Header = http.Header{"X-Echo": {encodings[req.Header.Get("X-Enc")](receivedValue(req, &sawValue))}}
			}
			return nil
		},
		Handler: func(ws *websocket.Conn) {
			req := ws.Request()
			e := encodings[req.Header.Get("X-Enc")](receivedValue(req, &sawValue))
			var in []byte
			websocket.Message.Receive(ws, &in)
			switch req.Header.Get("X-Part") {
			case "text":
				websocket.Message.Send(ws, "echo: "+e)
			case "binary":
				websocket.Message.Send(ws, []byte("echo: "+e))
			default:
				websocket.Message.Send(ws, "done")
			}
		},
	})

	custom := keyInjector{value: secretValue, placeholder: "custom-placeholder-0f1e2d3c4b5a6978"}
	injectors := []struct {
		name        string
		placeholder string
		header      func(http.Header)
		addr        string
	}{
		{"vault", r.ph, func(h http.Header) { h.Set("Authorization", "Bearer "+r.ph) }, r.addr},
		{"custom", custom.placeholder, func(h http.Header) { h.Set("X-Api-Key", custom.placeholder) }, ""},
	}
	customIC := &Interceptor{
		Leaves: r.ic.Leaves, Claim: r.ic.Claim, Guard: r.ic.Guard, Resolver: r.ic.Resolver, RootCAs: r.ic.RootCAs,
		Injector: custom,
		Redactor: keyRedactor{NewReplacer(SecretForms(secretValue, custom.placeholder)...)},
	}
	t.Cleanup(customIC.CloseIdleConnections)
	injectors[1].addr = serveWith(t, customIC, r)

	httpParts := []string{"header", "1xx", "body", "split-body", "trailer", "unannounced-trailer"}
	grpcParts := []string{"header", "body", "trailer", "unannounced-trailer"}
	wsParts := []string{"upgrade-header", "text", "binary"}
	for _, inj := range injectors {
		for encName, enc := range encodings {
			wantPH := enc(inj.placeholder)
			header := func(part string) http.Header {
				h := http.Header{"X-Part": {part}, "X-Enc": {encName}}
				inj.header(h)
				return h
			}
			check := func(t *testing.T, seen string) {
				assert.True(t, sawValue.Swap(false), "the upstream did not receive the value")
				assertNoValue(t, "the response", seen)
				assert.Contains(t, seen, wantPH, "the echo, with the placeholder in its place, did not arrive")
			}
			for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
				c := r.client(inj.addr, proto == "HTTP/2")
				for _, part := range httpParts {
					t.Run(strings.Join([]string{inj.name, proto, part, encName}, "/"), func(t *testing.T) {
						check(t, seenOver(t, c, "GET", "https://api.test/table", nil, header(part)))
					})
				}
			}
			c := r.client(inj.addr, true)
			for _, part := range grpcParts {
				t.Run(strings.Join([]string{inj.name, "gRPC", part, encName}, "/"), func(t *testing.T) {
					h := header(part)
					h.Set("Content-Type", "application/grpc")
					h.Set("TE", "trailers")
					check(t, seenOver(t, c, "POST", "https://api.test/table.Echo/Call", grpcFrame("call"), h))
				})
			}
			for _, part := range wsParts {
				t.Run(strings.Join([]string{inj.name, "WebSocket", part, encName}, "/"), func(t *testing.T) {
					check(t, seenOverWebSocket(t, r, inj.addr, header(part)))
				})
			}
		}
	}
}

// serveWith intercepts connections to a new address with ic, as agent
// a1 to api.test on the rig's upstream.
func serveWith(t *testing.T, ic *Interceptor, r *rig) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go ic.Intercept(t.Context(), c, "a1", r.current, "api.test", r.upPort)
		}
	}()
	return ln.Addr().String()
}

// TestLengthNeverShown: where redaction applies, no field tells the
// sandbox the length or digest of what the upstream sent, on HEAD as on
// GET (a length, if any, is the redacted body's own); and no range of a
// body is asked for.
func TestLengthNeverShown(t *testing.T) {
	r := newRig(t)
	var sawRange atomic.Bool
	r.mux.HandleFunc("/sized", func(w http.ResponseWriter, req *http.Request) {
		sawRange.Store(req.Header.Get("Range") != "" || req.Header.Get("If-Range") != "")
		body := "echo " + req.Header.Get("Authorization")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.Header().Set("Digest", "sha-256=abc")
		w.Header().Set("Content-Digest", "sha-256=:abc:")
		w.Header().Set("Repr-Digest", "sha-256=:abc:")
		w.Header().Set("Content-Md5", "abc")
		if req.Method != http.MethodHead {
			io.WriteString(w, body)
		}
	})
	for _, h2 := range []bool{false, true} {
		c := r.client(r.addr, h2)
		for _, method := range []string{http.MethodHead, http.MethodGet} {
			t.Run(fmt.Sprintf("%s/h2=%v", method, h2), func(t *testing.T) {
				req, _ := http.NewRequest(method, "https://api.test/sized", nil)
				req.Header.Set("Authorization", "Bearer "+r.ph)
				req.Header.Set("Range", "bytes=0-3")
				req.Header.Set("If-Range", `"x"`)
				resp, err := c.Do(req)
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				if method == http.MethodHead {
					assert.EqualValues(t, -1, resp.ContentLength, "the upstream's length reached the sandbox")
				} else if resp.ContentLength >= 0 { // the redacted body's own, which net/http may set
					assert.EqualValues(t, len(body), resp.ContentLength, "the upstream's length reached the sandbox")
					assert.Contains(t, string(body), r.ph)
				}
				for _, k := range []string{"Digest", "Content-Digest", "Repr-Digest", "Content-Md5"} {
					assert.Empty(t, resp.Header.Get(k), k)
				}
				assert.False(t, sawRange.Load(), "a range was asked of the upstream")
			})
		}
	}
}

// TestInjectorWithoutRedactorRefused: an Interceptor whose Injector
// cannot redact, and no Redactor, refuses its connections; NoRedaction
// says on purpose that nothing needs it.
func TestInjectorWithoutRedactorRefused(t *testing.T) {
	r := newRig(t)
	ic := &Interceptor{Leaves: r.ic.Leaves, Claim: r.ic.Claim, Injector: keyInjector{secretValue, "ph"}, Guard: r.ic.Guard, Resolver: r.ic.Resolver, RootCAs: r.ic.RootCAs}
	t.Cleanup(ic.CloseIdleConnections)
	srv, cli := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- ic.Intercept(t.Context(), srv, "a1", r.current, "api.test", r.upPort) }()
	cli.SetDeadline(time.Now().Add(5 * time.Second))
	assert.Error(t, tls.Client(cli, &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}).Handshake(), "an interception began")
	assert.ErrorIs(t, <-done, ErrNoRedactor)

	ic.Redactor = NoRedaction
	resp, body := r.get(r.client(serveWith(t, ic, r), false), "https://api.test/", http.Header{"X-Api-Key": {"ph"}})
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, secretValue, r.upstreamHeader().Get("X-Api-Key"), "NoRedaction still injects")
}

// TestEchoesInFieldNamesAreDropped: a response field whose name echoes
// the value (an upstream that turns query keys into headers, as
// httpbin's /response-headers does, and net/http capitalises), or whose
// value echoes it in another letter case, is dropped, in the headers,
// both kinds of trailer, and an upgrade's response head; the response's
// other fields arrive.
func TestEchoesInFieldNamesAreDropped(t *testing.T) {
	var sawValue atomic.Bool
	r := newRig(t)
	r.mux.HandleFunc("/names", func(w http.ResponseWriter, req *http.Request) {
		v := receivedValue(req, &sawValue)
		w.Header().Set("X-Kept", "yes")
		switch req.Header.Get("X-Part") {
		case "header-name":
			w.Header().Set(v, "1")
		case "header-value-upper":
			w.Header().Set("X-Echo", strings.ToUpper(v))
		case "trailer-name":
			w.Header().Set("Trailer", v)
			w.Write([]byte("body\n"))
			w.Header().Set(v, "t")
		case "unannounced-trailer-name":
			w.Write([]byte("body\n"))
			w.Header().Set(http.TrailerPrefix+v, "t")
		}
	})
	r.mux.Handle("/ws-table", websocket.Server{
		Handshake: func(cfg *websocket.Config, req *http.Request) error {
			cfg.Header = http.Header{http.CanonicalHeaderKey(receivedValue(req, &sawValue)): {"1"}, "X-Kept": {"yes"}}
			return nil
		},
		Handler: func(ws *websocket.Conn) {
			var in []byte
			websocket.Message.Receive(ws, &in)
			websocket.Message.Send(ws, "done")
		},
	})
	check := func(t *testing.T, seen string) {
		assert.True(t, sawValue.Swap(false), "the upstream did not receive the value")
		assert.NotContains(t, strings.ToLower(seen), secretValue, "the value, in some letter case, reached the sandbox")
		assert.Contains(t, seen, "X-Kept", "the response's other fields were dropped too")
	}
	header := func(part string) http.Header {
		return http.Header{"X-Part": {part}, "Authorization": {"Bearer " + r.ph}}
	}
	for _, h2 := range []bool{false, true} {
		c := r.client(r.addr, h2)
		for _, part := range []string{"header-name", "header-value-upper", "trailer-name", "unannounced-trailer-name"} {
			t.Run(fmt.Sprintf("%s/HTTP2=%v", part, h2), func(t *testing.T) {
				check(t, seenOver(t, c, "GET", "https://api.test/names", nil, header(part)))
			})
		}
	}
	t.Run("upgrade-header-name", func(t *testing.T) {
		check(t, seenOverWebSocket(t, r, r.addr, header("")))
	})
}

// TestUnreadableEncodingQuotesNothing: a response whose Content-Encoding
// echoes the value (in a mixed case the gateway's error would have
// lower-cased) is refused with a reason that quotes nothing the upstream
// chose, to the sandbox and in the record.
func TestUnreadableEncodingQuotesNothing(t *testing.T) {
	r := newRig(t)
	const mixed = "Sk-Mixed-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
	require.NoError(t, r.vault.Set(vault.Secret{Name: "mixed", Rule: vault.Rule{Hosts: []string{"api.test"}, Header: "X-Mixed"}}, []byte(mixed)))
	a, err := r.vault.Attach("a1", "mixed", "MIXED_KEY")
	require.NoError(t, err)
	r.mux.HandleFunc("/encoding", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Encoding", req.Header.Get("X-Mixed")+", gzip")
		w.Write([]byte("x"))
	})
	resp, body := r.get(r.client(r.addr, false), "https://api.test/encoding", http.Header{"X-Mixed": {a.Placeholder}})
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.NotContains(t, strings.ToLower(body), strings.ToLower(mixed), "the answer quoted the value")
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Path == "/encoding" })
	assert.Equal(t, "upstream: "+ReasonRedactFailed+": the response is in more than one encoding, which the gateway cannot read to keep secrets out of it", rec.Reason)
}

// TestRecordedPathAsSent: an intercepted request's path is recorded as
// it was sent: decoded, an encoded "?" ended the recorded path there.
func TestRecordedPathAsSent(t *testing.T) {
	r := newRig(t)
	r.get(r.client(r.addr, false), "https://api.test/ok%3F/exfil/c2VjcmV0", nil)
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Kind == egresslog.KindHTTP })
	assert.Equal(t, "/ok%3F/exfil/c2VjcmV0", rec.Path)
}
