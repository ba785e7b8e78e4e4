package mitm

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// grpcFrame is a gRPC length-prefixed message, uncompressed.
func grpcFrame(msg string) []byte {
	b := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:5], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

func readGRPCFrame(r io.Reader) (string, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return "", err
	}
	msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
	_, err := io.ReadFull(r, msg)
	return string(msg), err
}

// TestGRPCThroughInterception: a gRPC-shaped bidirectional stream, HTTP/2
// end to end: each request message is answered before the next is sent
// (both directions open at once), the credential is injected into the
// request headers, and the trailers reach the client.
func TestGRPCThroughInterception(t *testing.T) {
	r := newRig(t)
	var sawCredential atomic.Bool
	var upstreamProto atomic.Value
	r.mux.HandleFunc("/echo.Echo/Chat", func(w http.ResponseWriter, req *http.Request) {
		upstreamProto.Store(req.Proto)
		sawCredential.Store(req.Header.Get("Authorization") == "Bearer "+secretValue)
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		flush := http.NewResponseController(w).Flush
		flush()
		n := 0
		for {
			msg, err := readGRPCFrame(req.Body)
			if err != nil {
				break
			}
			n++
			w.Write(grpcFrame("echo " + msg))
			flush()
		}
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set("Grpc-Message", fmt.Sprintf("%d messages", n))
	})
	body, send := io.Pipe()
	req, err := http.NewRequest("POST", "https://api.test/echo.Echo/Chat", body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	req.Header.Set("Authorization", "Bearer "+r.ph)
	client := r.client(r.addr, true)
	respc := make(chan *http.Response, 1)
	go func() {
		resp, err := client.Do(req)
		if assert.NoError(t, err) {
			respc <- resp
		}
		close(respc)
	}()
	_, err = send.Write(grpcFrame("one"))
	require.NoError(t, err)
	var resp *http.Response
	select {
	case resp = <-respc:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "no response head while the request stream is open")
	}
	require.NotNil(t, resp)
	defer resp.Body.Close()
	assert.Equal(t, "HTTP/2.0", resp.Proto)
	for _, msg := range []string{"one", "two", "three"} {
		if msg != "one" {
			_, err := send.Write(grpcFrame(msg))
			require.NoError(t, err)
		}
		got := make(chan string, 1)
		go func() { m, _ := readGRPCFrame(resp.Body); got <- m }()
		select {
		case m := <-got:
			assert.Equal(t, "echo "+msg, m)
		case <-time.After(5 * time.Second):
			require.FailNow(t, "the answer to "+msg+" did not come while the request stream was open")
		}
	}
	send.Close()
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Empty(t, rest)
	assert.Equal(t, "0", resp.Trailer.Get("Grpc-Status"))
	assert.Equal(t, "3 messages", resp.Trailer.Get("Grpc-Message"))
	assert.True(t, sawCredential.Load(), "the credential was not injected")
	assert.Equal(t, "HTTP/2.0", upstreamProto.Load())
	assert.False(t, strings.Contains(fmt.Sprint(resp.Header, resp.Trailer), secretValue), "the credential came back")
}
