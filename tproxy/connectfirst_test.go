package tproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
)

// dialExplicit opens a raw connection to w's explicit proxy.
func (w *world) dialExplicit() net.Conn {
	w.t.Helper()
	c, err := net.Dial("tcp", w.explicit.Addr().String())
	require.NoError(w.t, err)
	w.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// TestFirstRequestHeads: the proxy reads a connection's first request
// head itself, and must hold it to what net/http would: a head whose
// method is not CONNECT goes to net/http whole (bytes read to tell
// replayed), and a later CONNECT on that connection is served there; a
// CONNECT head too large, malformed, with two Hosts or an invalid header
// is refused and its connection closed; one that does not come whole
// within the hello timeout (dripped a byte at a time) is closed.
func TestFirstRequestHeads(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*", "api.test:*"}, func(p *Proxy) { p.HelloTimeout = 500 * time.Millisecond })
	tunnelTo := fmt.Sprintf("svc.test:%d", w.bannerAddr.Port())

	t.Run("another method first, then a CONNECT", func(t *testing.T) {
		c := w.dialExplicit()
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET http://api.test:%d/ HTTP/1.1\r\nHost: api.test:%d\r\n\r\n", w.httpAddr.Port(), w.httpAddr.Port())
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		assert.Contains(t, string(body), "api.test")

		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", tunnelTo, tunnelTo)
		resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "SSH-2.0-test_banner\r\n", line)
		c.Close()
		require.Eventually(t, func() bool { return len(w.log.OpenConns("a1")) == 0 }, 5*time.Second, 10*time.Millisecond)
	})

	for _, tc := range []struct {
		name, head string
		status     int
	}{
		{"too large", "CONNECT " + tunnelTo + " HTTP/1.1\r\nHost: " + tunnelTo + "\r\nX-Pad: " + strings.Repeat("a", 80<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"malformed", "CONNECT " + tunnelTo + " HTTP/1.1\r\nno colon here\r\n\r\n", http.StatusBadRequest},
		{"two Hosts", "CONNECT " + tunnelTo + " HTTP/1.1\r\nHost: " + tunnelTo + "\r\nHost: other.test:1\r\n\r\n", http.StatusBadRequest},
		{"an invalid header value", "CONNECT " + tunnelTo + " HTTP/1.1\r\nHost: " + tunnelTo + "\r\nX-Bad: a\x01b\r\n\r\n", http.StatusBadRequest},
		{"HTTP/2.0", "CONNECT " + tunnelTo + " HTTP/2.0\r\nHost: " + tunnelTo + "\r\n\r\n", http.StatusHTTPVersionNotSupported},
		{"HTTP/9.9", "CONNECT " + tunnelTo + " HTTP/9.9\r\nHost: " + tunnelTo + "\r\n\r\n", http.StatusHTTPVersionNotSupported},
		{"an unknown expectation", "CONNECT " + tunnelTo + " HTTP/1.1\r\nHost: " + tunnelTo + "\r\nExpect: x-foo\r\n\r\n", http.StatusExpectationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := w.dialExplicit()
			go io.WriteString(c, tc.head) // it may be refused before it is all written
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.True(t, resp.Close, "the connection stays open")
			assert.NotEmpty(t, resp.Header.Get("Proxy-Status"))
			// Closed (a reset, for a head still being written): not
			// kept open until the deadline.
			_, err = io.ReadAll(br)
			assert.False(t, isTimeout(err), "the connection stays open")
		})
	}

	t.Run("a short head that is not a CONNECT", func(t *testing.T) {
		c := w.dialExplicit()
		io.WriteString(c, "GET /\r\n") // and waits: net/http says 400 at once
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})

	t.Run("handed to net/http after most of the hello timeout", func(t *testing.T) {
		c := w.dialExplicit()
		start := time.Now()
		go func() {
			time.Sleep(400 * time.Millisecond)
			io.WriteString(c, "GET http:")
			for range 30 {
				if _, err := io.WriteString(c, "a"); err != nil {
					return
				}
				time.Sleep(30 * time.Millisecond)
			}
		}()
		io.ReadAll(c)
		assert.Less(t, time.Since(start), 800*time.Millisecond, "a second hello timeout began at the handing over")
	})

	t.Run("dripped past the hello timeout", func(t *testing.T) {
		c := w.dialExplicit()
		start := time.Now()
		go func() {
			for _, b := range []byte("CONNECT " + tunnelTo + " HTTP/1.1\r\nHost: " + tunnelTo + "\r\n\r\n") {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		_, err := io.ReadAll(c)
		assert.NoError(t, err, "closed, not reset")
		assert.Less(t, time.Since(start), 5*time.Second, "held past the hello timeout")
		open := w.log.OpenConns("a1")
		assert.Empty(t, open, "a tunnel opened")
	})
}

// TestShutdownClosesFirstRequests: Shutdown closes a connection whose
// first request head is still coming, and returns; its source's count
// is released.
func TestShutdownClosesFirstRequests(t *testing.T) {
	w := newWorld(t, []string{"svc.test:*"}, func(p *Proxy) { p.MaxExplicitConnsPerSource = 1 })
	c := w.dialExplicit()
	_, err := io.WriteString(c, "CONNECT svc.test:1 HTTP/1.1\r\n")
	require.NoError(t, err)
	w.proxy.init() // Serve's, which made pending, happened before
	require.Eventually(t, func() bool {
		w.proxy.mu.Lock()
		defer w.proxy.mu.Unlock()
		return len(w.proxy.pending) == 1
	}, 5*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, w.proxy.Shutdown(ctx))
	_, err = io.ReadAll(c)
	assert.False(t, isTimeout(err), "not closed") // a reset, if its bytes were not read yet
	assert.Eventually(t, func() bool {
		n := 0
		w.proxy.explicitCounted.Range(func(any, any) bool { n++; return true })
		return n == 0
	}, 5*time.Second, time.Millisecond, "counts left behind")
	assert.Empty(t, w.log.List(egresslog.Filter{}, 10), "a request that never came was recorded")
}

// TestApprovalEndsWithItsClient: a CONNECT waiting for an approval stops
// waiting when its client goes, or when Shutdown comes, and is recorded
// as refused for that: else a sandbox could leave approvals pending
// without holding a socket, and lock its own source out of the explicit
// proxy (its connections still counted), and a wait would outlive
// Shutdown.
func TestApprovalEndsWithItsClient(t *testing.T) {
	b := &approval.Broker{Timeout: time.Minute}
	w := newWorld(t, nil, func(p *Proxy) { p.Approver = b; p.MaxExplicitConnsPerSource = 2 })
	w.setPolicy(policy.Config{Ask: true})
	target := fmt.Sprintf("svc.test:%d", w.bannerAddr.Port())
	waiting := func() int {
		n := 0
		for _, r := range b.Pending() {
			n += r.Waiting
		}
		return n
	}
	connect := func() net.Conn {
		c := w.dialExplicit()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		require.Eventually(t, func() bool { return waiting() == 1 }, 5*time.Second, time.Millisecond, "no approval asked")
		return c
	}
	refusals := 0 // recorded so far, each for an approval that ended with its client
	gone := func(why string) {
		require.Eventually(t, func() bool { return waiting() == 0 }, 5*time.Second, time.Millisecond, "the approval still waits %s", why)
		refusals++
		assert.Eventually(t, func() bool {
			n := 0
			for _, r := range w.log.List(egresslog.Filter{Kind: egresslog.KindConnect, DeniedOnly: true}, 100) {
				if strings.Contains(r.Reason, policy.ReasonApprovalGone) {
					n++
				}
			}
			return n == refusals
		}, 5*time.Second, time.Millisecond, "no record of the refusal %s", why)
	}
	for range 2 {
		connect().Close()
		gone("after its client went")
	}
	// A client that spoke ahead of its answer, then went: its byte waits
	// unread, and a peek no longer shows its end.
	ahead := connect()
	_, err := ahead.Write([]byte("x"))
	require.NoError(t, err)
	ahead.Close()
	gone("after its client sent a byte ahead and went")
	require.Eventually(t, func() bool { // once its refusal is done, the source's count is given back
		n := 0
		w.proxy.explicitCounted.Range(func(any, any) bool { n++; return true })
		return n == 0
	}, 5*time.Second, time.Millisecond)
	c := connect()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, w.proxy.Shutdown(ctx))
	gone("after Shutdown")
	c.Close()
}
