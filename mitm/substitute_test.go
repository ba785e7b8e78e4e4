package mitm

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/internal/redact"
	"github.com/agenthold/egress/vault"
)

// TestSubstitutionThroughInterception: a rule that opts in has its
// placeholder replaced in the URL path, a JSON body and the client's
// WebSocket text messages; the upstream gets the value and echoes it,
// and the sandbox sees its placeholder in every echo.
func TestSubstitutionThroughInterception(t *testing.T) {
	r := newRig(t)
	const value = "987654:REAL-substituted-token"
	require.NoError(t, r.vault.Set(vault.Secret{Name: "bot", Rule: vault.Rule{Hosts: []string{"api.test"},
		ReplaceIn: []string{vault.InPath, vault.InBody, vault.InWebSocket}, BodyTypes: []string{"application/json"}}}, []byte(value)))
	att, err := r.vault.Attach("a1", "bot", "BOT_TOKEN")
	require.NoError(t, err)
	ph := att.Placeholder

	var mu sync.Mutex
	var seen []string // what the upstream received
	saw := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	r.mux.HandleFunc("/bot/", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		saw(req.URL.Path)
		saw(string(body))
		fmt.Fprintf(w, "path=%s length=%d body=%s", req.URL.Path, req.ContentLength, body)
	})
	r.mux.Handle("/ws", websocket.Handler(func(ws *websocket.Conn) {
		for {
			var msg []byte // text or binary
			if websocket.Message.Receive(ws, &msg) != nil {
				return
			}
			saw(string(msg))
			websocket.Message.Send(ws, "you said: "+string(msg))
		}
	}))

	body := `{"chat":1,"token":"` + ph + `"}`
	req, _ := http.NewRequest("POST", "https://api.test/bot/"+ph+"/sendMessage", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client(r.addr, true).Do(req)
	require.NoError(t, err)
	echo, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", echo)
	assert.Contains(t, string(echo), "path=/bot/"+ph+"/sendMessage", "the path's echo")
	assert.Contains(t, string(echo), fmt.Sprintf("length=%d", len(body)-len(ph)+len(value)), "the corrected length")
	assert.Contains(t, string(echo), `"token":"`+ph+`"`, "the body's echo")

	cfg, err := websocket.NewConfig("wss://api.test/ws", "https://api.test/")
	require.NoError(t, err)
	cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	ws, err := websocket.NewClient(cfg, tls.Client(raw, cfg.TlsConfig))
	require.NoError(t, err, "websocket handshake")
	defer ws.Close()
	for _, msg := range []string{"token " + ph + " in a message", strings.Repeat("more ", 500) + ph} {
		require.NoError(t, websocket.Message.Send(ws, msg))
		var got string
		ws.SetDeadline(time.Now().Add(5 * time.Second))
		require.NoError(t, websocket.Message.Receive(ws, &got))
		assert.Equal(t, "you said: "+msg, got, "the echo comes back with the placeholder")
	}
	require.NoError(t, websocket.Message.Send(ws, []byte("binary "+ph)))
	var gotBinary string
	require.NoError(t, websocket.Message.Receive(ws, &gotBinary))
	assert.Equal(t, "you said: binary "+ph, gotBinary)

	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(seen, "\n")
	assert.Equal(t, 4, strings.Count(all, value), "the upstream got the value in the path, the body and both text messages")
	assert.Equal(t, 1, strings.Count(all, ph), "a placeholder reached the upstream where it should have been replaced")
	assert.Contains(t, all, "binary "+ph, "a binary message was changed")
}

// clientFrame is a frame as a client sends it: masked.
func clientFrame(fin bool, opcode byte, payload string) []byte {
	return (&frameParser{masked: true}).appendFrame(nil, fin, opcode, []byte(payload))
}

// wireFrame is a frame as read off the wire, unmasked.
type wireFrame struct {
	fin     bool
	opcode  byte
	payload []byte
}

// splitFrames parses b into whole frames, written by a client (masked)
// or a server (not): every frame must be masked as its writer masks, and
// the last must be whole.
func splitFrames(t testing.TB, b []byte, masked bool) []wireFrame {
	var out []wireFrame
	for len(b) > 0 {
		require.GreaterOrEqual(t, len(b), 2, "a frame cut short")
		require.Equal(t, masked, b[1]&0x80 != 0, "a frame masked the wrong way")
		n, h := uint64(b[1]&0x7f), 2
		switch n {
		case 126:
			require.GreaterOrEqual(t, len(b), 4, "a frame cut short")
			n, h = uint64(binary.BigEndian.Uint16(b[2:4])), 4
		case 127:
			require.GreaterOrEqual(t, len(b), 10, "a frame cut short")
			n, h = binary.BigEndian.Uint64(b[2:10]), 10
		}
		var key []byte
		if masked {
			key, h = b[h:h+4], h+4
		}
		require.LessOrEqual(t, n, uint64(len(b)-h), "a frame cut short")
		payload := bytes.Clone(b[h : h+int(n)])
		for i := range payload {
			if masked {
				payload[i] ^= key[i&3]
			}
		}
		out = append(out, wireFrame{fin: b[0]&0x80 != 0, opcode: b[0] & 0x0f, payload: payload})
		b = b[h+int(n):]
	}
	return out
}

// readFrames parses a client's frames as a server would and joins each
// message's fragments; control frames are returned as they come.
func readFrames(t *testing.T, b []byte) []string {
	var out []string
	var msg []byte
	for _, f := range splitFrames(t, b, true) {
		if f.opcode >= 8 {
			out = append(out, fmt.Sprintf("control %d: %s", f.opcode, f.payload))
			continue
		}
		msg = append(msg, f.payload...)
		if f.fin {
			out = append(out, string(msg))
			msg = nil
		}
	}
	return out
}

type sink struct{ b []byte }

func (s *sink) Write(p []byte) (int, error) { s.b = append(s.b, p...); return len(p), nil }

// TestFrameSubstituter: a text message in fragments, with the placeholder
// across a fragment boundary and a ping between, written a byte at a
// time, reaches the server whole and substituted; a binary message is
// left as it is; an unmasked or compressed frame ends the connection.
func TestFrameSubstituter(t *testing.T) {
	const ph, value = "placeholder-0123456789", "the-real-value"
	var in []byte
	in = append(in, clientFrame(false, 1, "a message with placehol")...)
	in = append(in, clientFrame(true, 9, "ping placeholder-0123456789")...)
	in = append(in, clientFrame(false, 0, "der-0123")...)
	in = append(in, clientFrame(true, 0, "456789 in it")...)
	in = append(in, clientFrame(true, 2, "binary "+ph)...)
	out := &sink{}
	sub := redact.New([]redact.Pair{{Find: ph, Replace: value}})
	f := newFrameSubstituter(out, sub)
	for i := range in {
		_, err := f.Write(in[i : i+1])
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"control 9: ping " + ph, "a message with " + value + " in it", "binary " + ph}, readFrames(t, out.b))

	unmasked := newFrameSubstituter(&sink{}, sub)
	_, err := unmasked.Write([]byte{0x81, 0x02, 'h', 'i'})
	assert.Error(t, err, "an unmasked frame")
	compressed := newFrameSubstituter(&sink{}, sub)
	c := clientFrame(true, 1, "x")
	c[0] |= 0x40
	_, err = compressed.Write(c)
	assert.Error(t, err, "a compressed frame")
}

// FuzzFrameSubstituter: whatever a client writes, in whatever pieces, the
// substituter neither panics nor sends the server an unmasked frame.
func FuzzFrameSubstituter(f *testing.F) {
	f.Add(clientFrame(true, 1, "hello placeholder-0123456789"), uint8(3))
	f.Add(append(clientFrame(false, 1, "a"), clientFrame(true, 0, "b")...), uint8(1))
	f.Add([]byte{0x81, 0xfe, 0xff, 0xff, 1, 2, 3, 4}, uint8(5))
	sub := redact.New([]redact.Pair{{Find: "placeholder-0123456789", Replace: "value"}})
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		out := &sink{}
		fs := newFrameSubstituter(out, sub)
		n := max(int(step), 1)
		for i := 0; i < len(in); i += n {
			if _, err := fs.Write(in[i:min(i+n, len(in))]); err != nil {
				return
			}
		}
		splitFrames(t, out.b, true) // every frame to the server whole and masked
	})
}

// fakeConn reads from r and discards writes.
type fakeConn struct{ io.Reader }

func (fakeConn) Write(p []byte) (int, error) { return len(p), nil }
func (fakeConn) Close() error                { return nil }

// FuzzFrameRedactor: whatever a server sends, the redactor neither panics
// nor lets a secret through in a frame it passes on.
func FuzzFrameRedactor(f *testing.F) {
	server := func(fin bool, opcode byte, payload string) []byte {
		return (&frameParser{}).appendFrame(nil, fin, opcode, []byte(payload))
	}
	f.Add(server(true, 1, "the secret-value-0123 echoed"))
	f.Add(append(server(false, 2, "secret-val"), server(true, 0, "ue-0123")...))
	f.Add(append(server(false, 1, "a"), append(server(true, 9, "ping secret-value-0123"), server(true, 0, "b")...)...))
	red := redact.New([]redact.Pair{{Find: "secret-value-0123", Replace: "placeholder-99999"}})
	f.Fuzz(func(t *testing.T, in []byte) {
		fr := newFrameRedactor(fakeConn{bytes.NewReader(in)}, red, nil)
		out, _ := io.ReadAll(fr)
		var payloads []byte
		for _, fr := range splitFrames(t, out, false) { // every frame to the client whole and unmasked
			payloads = append(payloads, fr.payload...)
		}
		if !bytes.Contains(in, []byte("secret-value-0123")) {
			return // a secret spelt across frames of several messages is no secret sent
		}
		assert.False(t, bytes.Contains(payloads, []byte("secret-value-0123")), "a secret in one frame went through")
	})
}
