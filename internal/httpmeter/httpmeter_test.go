package httpmeter

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHeadSize: a request head as net/http parsed it weighs what was sent.
func TestHeadSize(t *testing.T) {
	head := "GET /a/b?c=d HTTP/1.1\r\nHost: example.com\r\nUser-Agent: test\r\nX-Many: 1\r\nX-Many: 2\r\n\r\n"
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head)))
	require.NoError(t, err)
	assert.EqualValues(t, len(head), HeadSize(r))
}

// TestWriterCountsHeads: the Writer counts the head a first Write
// implies, as what HTTP/1.1 writes of its fields, and the body; a
// superfluous head is neither counted nor taken for the status.
func TestWriterCountsHeads(t *testing.T) {
	w := &Writer{ResponseWriter: httptest.NewRecorder()}
	w.Header().Set("Link", "</style.css>; rel=preload")
	w.Header().Set("X-Test", "yes")
	io.WriteString(w, "body")
	want := len("HTTP/1.1 200 OK\r\nLink: </style.css>; rel=preload\r\nX-Test: yes\r\n\r\n") + len("body")
	assert.Equal(t, http.StatusOK, w.Status)
	assert.EqualValues(t, want, w.Bytes)
	w.WriteHeader(http.StatusTeapot)
	assert.Equal(t, http.StatusOK, w.Status)
	assert.EqualValues(t, want, w.Bytes)
}

// TestCountRequest: a request's count is its head at once, and its body
// as it is read.
func TestCountRequest(t *testing.T) {
	head := "POST /up HTTP/1.1\r\nHost: example.com\r\nContent-Length: 5\r\n\r\n"
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head + "hello")))
	require.NoError(t, err)
	c := CountRequest(r)
	headSize := HeadSize(r)
	assert.Equal(t, headSize, c.Bytes())
	io.Copy(io.Discard, r.Body)
	assert.Equal(t, headSize+5, c.Bytes())
}
