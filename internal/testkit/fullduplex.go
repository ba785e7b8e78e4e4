package testkit

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

// EarlyAnswer is an upstream's handler that answers at once, before it
// reads the request's body, then says how much of the body it read: a
// streamed upload answered as it goes. Its first line is "early".
func EarlyAnswer(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if r.ProtoMajor == 1 { // HTTP/2's streams are full duplex
		if err := rc.EnableFullDuplex(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	io.WriteString(w, "early\n")
	rc.Flush()
	n, err := io.Copy(io.Discard, r.Body)
	fmt.Fprintf(w, "got %d %v\n", n, err)
}

// CheckEarlyAnswer sends, on c, head (a POST's request line and fields,
// up to the line that ends them, for a body of 10 bytes) and half the
// body; reads EarlyAnswer's first line; then sends the rest and checks
// that the upstream read it all, that the answer ends whole, and that
// the connection is not kept for another request.
func CheckEarlyAnswer(t *testing.T, c net.Conn, head string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err := io.WriteString(c, head+"Content-Length: 10\r\n\r\nhello")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "no answer before the body's end")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body := bufio.NewReader(resp.Body)
	line, err := body.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "early\n", line)

	_, err = io.WriteString(c, "world")
	require.NoError(t, err)
	line, err = body.ReadString('\n')
	assert.NoError(t, err, "the answer was cut")
	assert.Equal(t, "got 10 <nil>\n", line)
	// Answered before the body's end, which might never come, the
	// connection is not kept for a next request.
	assert.True(t, resp.Close, "kept alive after an answer that came before the body's end")
	_, err = io.Copy(io.Discard, body)
	assert.NoError(t, err, "the answer did not end")
}
