package mitm

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
)

// TestInterceptCancelledWithLiveClients cancels Intercept's context while
// kept-alive clients (HTTP/1.1 and HTTP/2) keep sending requests, so that
// requests start at every point of its wind-down: Intercept must return,
// and -race must find no request counted after its wait began.
func TestInterceptCancelledWithLiveClients(t *testing.T) {
	r := newRig(t)
	for cycle := range 40 {
		h2 := cycle%2 == 0
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.ic.Intercept(ctx, c, "a1", r.current, "api.test", r.upPort)
		}()

		c := r.client(ln.Addr().String(), h2)
		var clients sync.WaitGroup
		served := make(chan struct{}, 64)
		for range 4 {
			clients.Add(1)
			go func() {
				defer clients.Done()
				for range 50 {
					resp, err := c.Get("https://api.test/")
					if err != nil {
						return // the connection was closed under us: expected
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						select {
						case served <- struct{}{}:
						default:
						}
					}
				}
			}()
		}
		<-served // at least one request went through before the cancel
		for range cycle % 5 {
			<-served
		}
		cancel()
		select {
		case <-returned:
		case <-time.After(10 * time.Second):
			require.FailNowf(t, "Intercept still running 10s after its context ended", "cycle %d", cycle)
		}
		ln.Close()
		c.CloseIdleConnections()
		clients.Wait()
	}
	assert.NotEmpty(t, r.log.List(egresslog.Filter{Agent: "a1"}, 1), "requests were recorded")
}
