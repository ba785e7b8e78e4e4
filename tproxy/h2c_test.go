package tproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// TestH2CPriorKnowledge: plain HTTP/2 with prior knowledge (plain gRPC to
// an in-cluster service) goes through the transparent path as HTTP/2,
// each stream judged by its own :authority, with streaming bodies and
// trailers intact.
func TestH2CPriorKnowledge(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	ln := listenLoop(t, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Trailer", "Grpc-Status")
		rw.Header().Set("Content-Type", "application/grpc")
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "%s %s %s", r.Proto, r.Host, b)
		rw.Header().Set("Grpc-Status", "0")
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	upstream := netip.MustParseAddrPort(ln.Addr().String())

	client := &http.Client{Transport: &http.Transport{
		Protocols: func() *http.Protocols { p := new(http.Protocols); p.SetUnencryptedHTTP2(true); return p }(),
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return w.tryDial(upstream)
		},
	}}
	post := func(host string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s:%d/svc.Echo/Call", host, upstream.Port()), strings.NewReader("ping"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/grpc")
		resp, err := client.Do(req)
		require.NoError(t, err)
		return resp
	}
	resp := post("api.test")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "HTTP/2.0", resp.Proto, "the client's side")
	assert.Equal(t, fmt.Sprintf("HTTP/2.0 api.test:%d ping", upstream.Port()), string(body), "the upstream's side")
	assert.Equal(t, "0", resp.Trailer.Get("Grpc-Status"), "trailers")

	resp = post("blocked.test") // another stream of the same connection
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a stream for a host the policy refuses")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Host == "blocked.test" })
	assert.Equal(t, policy.ReasonNoRule, r.Reason, "record %+v", r)
}

// TestH2CStreamEndsOnRejudge: a stream in flight on an h2c connection (a
// server-streaming call) ends when a policy change refuses its host,
// with a record that says so, though its connection carries others.
func TestH2CStreamEndsOnRejudge(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	ln := listenLoop(t, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		for range 1000 { // a line every 20 ms, for up to 20 s
			if _, err := io.WriteString(rw, "tick\n"); err != nil {
				return
			}
			http.NewResponseController(rw).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	upstream := netip.MustParseAddrPort(ln.Addr().String())
	client := &http.Client{Transport: &http.Transport{
		Protocols: func() *http.Protocols { p := new(http.Protocols); p.SetUnencryptedHTTP2(true); return p }(),
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return w.tryDial(upstream)
		},
	}}
	resp, err := client.Get(fmt.Sprintf("http://api.test:%d/stream", upstream.Port()))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "HTTP/2.0", resp.Proto)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "tick\n", line)

	w.setPolicy(policy.Config{Mode: policy.DenyAll})
	w.proxy.Rejudge("a1")
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br)
		ended <- err
	}()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		assert.Fail(t, "the stream is still open after 5 s")
	}
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindHTTP && r.Path == "/stream" })
	assert.Equal(t, ReasonPolicyChanged+policy.ReasonDenyAll, r.Reason, "record %+v", r)
}
