package httpfwd

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClientKeepsTheConnectionInStep: an HTTP/1 connection carries the
// next request after a response written once its request's body was
// read to its end, and is closed after one written before: full duplex,
// net/http no longer reads what remains of a body before the response,
// and what never came must not be taken for the next request.
func TestClientKeepsTheConnectionInStep(t *testing.T) {
	for _, tc := range []struct {
		name      string
		readFirst bool
		interim   bool // a 100 Continue before the answer, which is no answer
	}{
		{"body read, then answered", true, false},
		{"answered, then body read", false, false},
		{"interim head, body read, then answered", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				client, w := NewClient(w, r)
				defer client.Finish()
				if tc.interim {
					w.WriteHeader(http.StatusContinue)
				}
				if !tc.readFirst {
					io.WriteString(w, "early\n")
					http.NewResponseController(w).Flush()
				}
				n, _ := io.Copy(io.Discard, r.Body)
				fmt.Fprintf(w, "got %d\n", n)
			})}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })

			c, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			for i := range 2 {
				_, err = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
				require.NoError(t, err)
				resp, err := http.ReadResponse(br, nil)
				if tc.interim && err == nil && resp.StatusCode == http.StatusContinue {
					resp, err = http.ReadResponse(br, nil)
				}
				require.NoError(t, err, "request %d", i)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				assert.Contains(t, string(body), "got 5\n")
				if !tc.readFirst {
					assert.True(t, resp.Close, "kept after an answer that came before the body's end")
					_, err = br.ReadByte()
					assert.ErrorIs(t, err, io.EOF, "the connection is still open")
					return
				}
				assert.False(t, resp.Close, "request %d: closed though its body was read", i)
			}
		})
	}
}
