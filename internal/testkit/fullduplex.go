package testkit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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

// EarlyAnswerUnread is an upstream's handler that answers at once, with
// "early", and returns without reading the request's body.
func EarlyAnswerUnread(w http.ResponseWriter, _ *http.Request) {
	http.NewResponseController(w).EnableFullDuplex()
	w.Header().Set("Content-Length", "6")
	io.WriteString(w, "early\n")
}

// CheckEndsAfterEarlyAnswer sends, on c, head (a POST's request line
// and fields, up to the line that ends them) for a body of 100,000 bytes
// of which only next comes (a whole request of its own); reads
// EarlyAnswerUnread's answer; and checks that the connection then ends,
// within 2 s, with no answer to next: it is not kept for the body that
// never comes, nor takes what came of it for a request.
func CheckEndsAfterEarlyAnswer(t *testing.T, c net.Conn, head, next string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err := io.WriteString(c, head+"Content-Length: 100000\r\n\r\n"+next)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "early\n", string(b))
	assert.True(t, resp.Close, "kept alive after an answer that came before the body's end")
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = br.ReadByte()
	assert.Error(t, err, "the body's bytes were answered as a request")
	assert.False(t, errors.Is(err, os.ErrDeadlineExceeded), "still open 2 s after its answer: %v", err)
}
