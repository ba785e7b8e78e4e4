package tproxy

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
)

// requestLineDisguises are first requests a server takes (Go's takes any
// token as a method, nginx skips empty lines before the request line)
// that do not start with a capital-letter method and a space; each asks
// for a host the policy refuses, on a connection to one it allows.
var requestLineDisguises = []struct {
	name  string
	parts []string // written with a pause between them
}{
	{"a lower-case method", []string{"get / HTTP/1.1\r\nHost: blocked.test\r\n\r\n"}},
	{"a method with a hyphen", []string{"M-SEARCH / HTTP/1.1\r\nHost: blocked.test\r\n\r\n"}},
	{"a method of 14 letters", []string{"ABCDEFGHIJKLMN / HTTP/1.1\r\nHost: blocked.test\r\n\r\n"}},
	{"empty lines first", []string{"\r\n\r\nget / HTTP/1.1\r\nHost: blocked.test\r\n\r\n"}},
	{"a request line longer than the first read", []string{"get /" + strings.Repeat("a", 6000) + " HTTP/1.1\r\nHost: blocked.test\r\n\r\n"}},
	{"a request line paused past the idle timeout", []string{"get / HT", "TP/1.1\r\nHost: blocked.test\r\n\r\n"}},
	{"a capital method paused past the idle timeout", []string{"GE", "T / HTTP/1.1\r\nHost: blocked.test\r\n\r\n"}},
}

// TestEveryRequestLineIsJudged: a request line in any form a server
// takes is judged as HTTP, by its Host, on the transparent path and
// inside a CONNECT tunnel: never passed through as other TCP to the
// allowed name's server, which would answer it for any host it serves.
func TestEveryRequestLineIsJudged(t *testing.T) {
	const pause = 300 * time.Millisecond
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.IdleTimeout = pause })
	w.setNames("api.test") // the name the agent looked up for the server's address
	send := func(t *testing.T, c net.Conn, parts []string) string {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		for i, p := range parts {
			if i > 0 {
				time.Sleep(3 * pause)
			}
			_, err := io.WriteString(c, p)
			require.NoError(t, err)
		}
		got, _ := io.ReadAll(c)
		return string(got)
	}
	for _, d := range requestLineDisguises {
		t.Run("transparent/"+d.name, func(t *testing.T) {
			got := send(t, w.dial(w.httpAddr), d.parts)
			assert.NotContains(t, got, "blocked.test", "the server answered a request the gateway did not judge")
			assert.Regexp(t, `^HTTP/1\.1 4\d\d `, got, "the gateway's refusal")
		})
		t.Run("tunnel/"+d.name, func(t *testing.T) {
			c, _, resp := w.connectTo(fmt.Sprintf("api.test:%d", w.httpAddr.Port()))
			require.Equal(t, 200, resp.StatusCode)
			got := send(t, c, d.parts)
			assert.NotContains(t, got, "blocked.test", "the server answered a request the gateway did not judge")
			assert.Regexp(t, `^HTTP/1\.1 4\d\d `, got, "the gateway's refusal")
		})
	}
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "blocked.test" && !r.Allowed })
	assert.Equal(t, egresslog.KindHTTP, rec.Kind)
}

// TestOtherTCPStillPasses: a client protocol of lines that are not
// request lines, or of binary, still reaches an allowed name's server.
func TestOtherTCPStillPasses(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	w.setNames("api.test")
	for _, first := range []string{"get key\r\n", "*1\r\n$4\r\nPING\r\n", "\x00\x00\x00\x08\x04\xd2\x16\x2f\n"} {
		c := w.dial(w.echoAddr)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err := io.WriteString(c, first)
		require.NoError(t, err)
		c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		require.NoError(t, err)
		assert.Equal(t, "echo:"+first, string(got), "%q was not passed through", first)
	}
}
