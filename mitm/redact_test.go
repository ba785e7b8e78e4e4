package mitm

import (
	"bufio"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/redact"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/vault"
)

// valueForms are the forms of secretValue a leak could take: raw, and
// every encoding redact.Forms lists.
func valueForms() []string {
	var forms []string
	for _, p := range redact.Forms(secretValue, "x") {
		forms = append(forms, p.Find)
	}
	return forms
}

// assertNoValue fails if text holds the secret in any form.
func assertNoValue(t *testing.T, where, text string) {
	t.Helper()
	for _, f := range valueForms() {
		if !assert.NotContains(t, text, f, "the secret, in one of its forms, reached the sandbox in %s", where) {
			return
		}
	}
}

// echoHandler is a host that reflects what it received, in every form a
// real one might: headers and query in the body, raw, JSON, URL-encoded
// and base64; a header, a cookie, a redirect-style Location; a trailer.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	body, _ := io.ReadAll(r.Body)
	j, _ := json.Marshal(map[string]any{"headers": r.Header, "query": r.URL.Query(), "body": string(body)})
	w.Header().Set("Trailer", "X-Echo-Trailer")
	w.Header().Set("X-Echo-Auth", auth)
	w.Header().Set("Location", "/next?"+r.URL.RawQuery)
	http.SetCookie(w, &http.Cookie{Name: "session", Value: base64.RawURLEncoding.EncodeToString([]byte(auth))})
	fmt.Fprintf(w, "raw: %s\nquery: %s\njson: %s\n", auth, r.URL.RawQuery, j)
	fmt.Fprintf(w, "url: %s\n", url.QueryEscape(auth))
	fmt.Fprintf(w, "b64: %s\n", base64.StdEncoding.EncodeToString([]byte(auth)))
	fmt.Fprintf(w, "b64 of the headers: %s\n", base64.StdEncoding.EncodeToString(j))
	w.Header().Set("X-Echo-Trailer", auth)
}

// TestEchoesAreRedacted: a rule's own host echoes what the gateway sent it,
// over HTTP/1.1 and HTTP/2. The server sees the value; the sandbox sees
// only its placeholder, in every form, in the headers, the body and the
// trailers.
func TestEchoesAreRedacted(t *testing.T) {
	r := newRig(t)
	r.mux.HandleFunc("/echo", func(w http.ResponseWriter, req *http.Request) {
		h := req.Header.Clone()
		r.upHeader.Store(&h)
		echoHandler(w, req)
	})
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			c := r.client(r.addr, h2)
			req, _ := http.NewRequest("POST", "https://api.test/echo?q="+r.ph+"&page=2", strings.NewReader("body with "+r.ph))
			req.Header.Set("Authorization", "Bearer "+r.ph)
			req.Header.Set("X-Api-Key", r.ph)
			resp, err := c.Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)

			assert.Equal(t, "Bearer "+secretValue, r.upstreamHeader().Get("Authorization"), "the server saw the value")
			assert.Equal(t, secretValue, r.upstreamHeader().Get("X-Api-Key"))
			assertNoValue(t, "the body", string(body))
			headers, _ := json.Marshal(resp.Header)
			assertNoValue(t, "the headers", string(headers))
			trailers, _ := json.Marshal(resp.Trailer)
			assertNoValue(t, "the trailers", string(trailers))
			assert.Equal(t, "Bearer "+r.ph, resp.Header.Get("X-Echo-Auth"))
			assert.Equal(t, "Bearer "+r.ph, resp.Trailer.Get("X-Echo-Trailer"))
			assert.Contains(t, string(body), "raw: Bearer "+r.ph)
			assert.Contains(t, string(body), "b64: "+base64.StdEncoding.EncodeToString([]byte("Bearer "+r.ph)))
			assert.Contains(t, string(body), "url: "+url.QueryEscape("Bearer "+r.ph))
		})
	}
}

// TestCompressedEchoesAreRedacted: the gateway asks for the identity
// encoding; a server that compresses anyway has gzip decoded and
// redacted, and an encoding the gateway cannot read is refused.
func TestCompressedEchoesAreRedacted(t *testing.T) {
	r := newRig(t)
	var asked atomic.Pointer[string]
	r.mux.HandleFunc("/gzip", func(w http.ResponseWriter, req *http.Request) {
		ae := req.Header.Get("Accept-Encoding")
		asked.Store(&ae)
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprintf(zw, "you sent %s", req.Header.Get("Authorization"))
		zw.Close()
	})
	r.mux.HandleFunc("/br", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Encoding", "br")
		fmt.Fprintf(w, "pretend-brotli %s", req.Header.Get("Authorization"))
	})
	c := r.client(r.addr, false)
	req, _ := http.NewRequest("GET", "https://api.test/gzip", nil)
	req.Header.Set("Accept-Encoding", "gzip, br")
	resp, err := c.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "identity", *asked.Load(), "the gateway asks for an encoding it can read")
	assert.Empty(t, resp.Header.Get("Content-Encoding"))
	assert.Equal(t, "you sent Bearer "+r.ph, string(body))

	resp, refused := r.get(c, "https://api.test/br", nil)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, refused, "cannot read")
	assertNoValue(t, "a refused body", refused)
}

// TestServerSentEventsStillStream: with redaction on, an event arrives
// while the server is still holding back the next one.
func TestServerSentEventsStillStream(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	r.mux.HandleFunc("/sse", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"auth\":%q}\n\n", req.Header.Get("Authorization"))
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprintf(w, "data: second\n\n")
	})
	for _, h2 := range []bool{false, true} {
		resp, err := r.client(r.addr, h2).Get("https://api.test/sse")
		require.NoError(t, err)
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		require.NoError(t, err, "h2=%v: the first event did not arrive before the second was sent", h2)
		assert.Equal(t, `data: {"auth":"Bearer `+r.ph+`"}`+"\n", line)
		release <- struct{}{}
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		assert.Contains(t, string(rest), "data: second")
	}
}

// TestWebSocketEchoesAreRedacted: a server's WebSocket messages that echo
// the injected header come back with the placeholder, whatever their
// fragmentation.
func TestWebSocketEchoesAreRedacted(t *testing.T) {
	r := newRig(t)
	var compression atomic.Pointer[string]
	r.mux.Handle("/ws", websocket.Server{Handler: func(ws *websocket.Conn) {
		auth := ws.Request().Header.Get("Authorization")
		ext := ws.Request().Header.Get("Sec-WebSocket-Extensions")
		compression.Store(&ext)
		var in string
		for websocket.Message.Receive(ws, &in) == nil {
			// One message whole, one in two frames cutting the value.
			websocket.Message.Send(ws, in+" / server saw "+auth)
			w, _ := ws.NewFrameWriter(websocket.TextFrame)
			half := len(auth) / 2
			w.Write([]byte("split " + auth[:half]))
			w.Close()
			ws.Write([]byte(auth[half:])) // a text frame of its own
		}
	}})
	cfg, err := websocket.NewConfig("wss://api.test/ws", "https://api.test/")
	require.NoError(t, err)
	cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
	cfg.Header = http.Header{"Sec-Websocket-Extensions": {"permessage-deflate"}}
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	ws, err := websocket.NewClient(cfg, tls.Client(raw, cfg.TlsConfig))
	require.NoError(t, err)
	defer ws.Close()
	require.NoError(t, websocket.Message.Send(ws, "hello"))
	ws.SetDeadline(time.Now().Add(5 * time.Second))
	var got []string
	for range 3 {
		var msg string
		require.NoError(t, websocket.Message.Receive(ws, &msg))
		got = append(got, msg)
	}
	all := strings.Join(got, "\n")
	assertNoValue(t, "WebSocket messages", all)
	assert.Equal(t, "hello / server saw Bearer "+r.ph, got[0])
	assert.Empty(t, *compression.Load(), "compression, which would hide a value, is not offered upstream")
}

// TestRefreshTokenOnlyThroughTheHook: the refresh token's placeholder is
// refused everywhere but in the grant the hook answers, and the refusal
// is recorded.
func TestRefreshTokenOnlyThroughTheHook(t *testing.T) {
	r := newRig(t)
	x := r.refreshEndpoint(t, false)
	c := r.client(r.addr, false)
	for _, tc := range []struct {
		name string
		req  func() *http.Request
	}{
		{"in the query", func() *http.Request {
			req, _ := http.NewRequest("POST", "https://api.test/oauth/token?grant_type=refresh_token&refresh_token="+x.ph, nil)
			return req
		}},
		{"in a header", func() *http.Request {
			req, _ := http.NewRequest("GET", "https://api.test/v1/me", nil)
			req.Header.Set("X-Refresh", x.ph)
			return req
		}},
		{"in another grant's body", func() *http.Request {
			req, _ := http.NewRequest("POST", "https://api.test/oauth/token", strings.NewReader("grant_type=authorization_code&code="+x.ph))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			return req
		}},
	} {
		before := x.grants.Load()
		resp, err := c.Do(tc.req())
		require.NoError(t, err, tc.name)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, tc.name)
		assert.Contains(t, string(body), "refresh", tc.name)
		assert.Equal(t, before, x.grants.Load(), "%s: nothing reached the token endpoint", tc.name)
		assertNoValue(t, tc.name, string(body))
	}
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Path == "/v1/me" })
	assert.False(t, rec.Allowed)
	assert.Contains(t, rec.Reason, "refresh grant")
}

// TestRefreshGrantAnswers: whatever the sandbox's Accept and whatever
// encoding the server answers in, the rotated token is kept and only
// placeholders go back, also where the answer echoes a token.
func TestRefreshGrantAnswers(t *testing.T) {
	for _, form := range []bool{false, true} {
		t.Run(fmt.Sprintf("form=%v", form), func(t *testing.T) {
			r := newRig(t)
			x := r.refreshEndpoint(t, form)
			c := r.client(r.addr, false)
			for round := 1; round <= 2; round++ {
				req, _ := http.NewRequest("POST", "https://api.test/oauth/token", strings.NewReader("grant_type=refresh_token&refresh_token="+x.ph))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Accept", "*/*")
				resp, err := c.Do(req)
				require.NoError(t, err)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode, "round %d: %s", round, body)
				assert.Contains(t, string(body), x.ph, "round %d", round)
				for n := range round + 2 {
					assert.NotContains(t, string(body), fmt.Sprintf("RT-%d-real", n), "round %d: a refresh token reached the sandbox", round)
				}
				assert.NotContains(t, string(body), base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("RT-%d-real", round))), "round %d: the old token's echo, base64", round)
			}
			assert.EqualValues(t, 2, x.grants.Load(), "each grant rotated the token, and the gateway kept up")
		})
	}
}

// refreshFixture is a token endpoint on the rig's upstream that rotates
// its refresh token on every grant, echoing the token it got (base64) in
// its answer, in JSON or form-encoded as asked.
type refreshFixture struct {
	ph     string
	grants atomic.Int32
}

func (r *rig) refreshEndpoint(t *testing.T, formAnswers bool) *refreshFixture {
	x := &refreshFixture{}
	var current atomic.Pointer[string]
	first := "RT-1-real"
	current.Store(&first)
	r.mux.HandleFunc("/oauth/token", func(w http.ResponseWriter, req *http.Request) {
		req.ParseForm()
		got := req.PostForm.Get("refresh_token")
		if req.PostForm.Get("grant_type") != "refresh_token" || got != *current.Load() {
			http.Error(w, `{"error":"invalid_grant","got":"`+got+`"}`, http.StatusBadRequest)
			return
		}
		n := x.grants.Add(1)
		next := fmt.Sprintf("RT-%d-real", n+1)
		current.Store(&next)
		echo := base64.StdEncoding.EncodeToString([]byte(got))
		if formAnswers {
			w.Header().Set("Content-Type", "application/x-www-form-urlencoded")
			fmt.Fprintf(w, "access_token=AT-%d&refresh_token=%s&previous=%s", n, next, url.QueryEscape(echo))
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("AT-%d", n), "refresh_token": next, "previous": echo})
	})
	rule := vault.Rule{Hosts: []string{"api.test"}, Header: "Authorization", Mode: vault.Refresh, Paths: []string{"/oauth/token"}}
	require.NoError(t, r.vault.Set(vault.Secret{Name: "refresh", Rule: rule}, []byte(first)))
	a, err := r.vault.Attach("a1", "refresh", "REFRESH")
	require.NoError(t, err)
	x.ph = a.Placeholder
	hook := &RefreshExchange{Host: fmt.Sprintf("api.test:%d", r.upPort), Path: "/oauth/token", RefreshSecret: "refresh", Store: r.vault, Client: r.ic.Client(false)}
	r.ic.Hooks = []Hook{hook.Hook()}
	return x
}

// TestUpstreamErrorNeverQuotesTheSecret: an upstream that answers with
// the request line it got (the injected secret in its query) as a
// malformed status line makes the transport quote it in its error; the
// 502 and the record carry the placeholder instead.
func TestUpstreamErrorNeverQuotesTheSecret(t *testing.T) {
	r := newRig(t)
	ln, err := tls.Listen("tcp", "127.0.0.2:0", &tls.Config{GetCertificate: upstreamCert(r.upRoot)})
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fields := strings.Fields(line)
				if len(fields) > 1 {
					fmt.Fprintf(c, "HTTP/1.1 %s\r\n\r\n", fields[1]) // the path and query, as a status
				}
			}()
		}
	}()
	addr := r.serveInterceptedTo("api.test", uint16(ln.Addr().(*net.TCPAddr).Port))
	resp, body := r.get(r.client(addr, false), "https://api.test/x?q="+r.ph, nil)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, body, "malformed", "the error is still told")
	// Not assert.NotContains: its message would print the secret.
	assert.False(t, strings.Contains(body, secretValue), "the 502 quotes the secret")
	rec := testkit.WaitRecord(t, r.log, func(rec egresslog.Record) bool { return rec.Path == "/x" && rec.Status == http.StatusBadGateway })
	assert.False(t, strings.Contains(rec.Reason, secretValue), "the record quotes the secret")
}
