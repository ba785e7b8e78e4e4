package httpfwd

import (
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/netguard"
)

// poolsForLoopback are Pools whose dials may reach loopback, where the
// tests' servers are.
func poolsForLoopback(t *testing.T) *Pools[*int] {
	return poolsFor(t, Config{})
}

// poolsFor are Pools of transports made with cfg, whose dials may reach
// loopback.
func poolsFor(t *testing.T, cfg Config) *Pools[*int] {
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	cfg.Guard = guard
	ps := &Pools[*int]{New: func(string) *Transports { return NewTransports(cfg) }}
	t.Cleanup(ps.CloseIdleConnections)
	return ps
}

// poolOf is the pool a request of agent's under pol would take now.
func poolOf(ps *Pools[*int], agent string, pol *int) *Transports {
	ts := ps.take(agent, pol)
	ts.users.Add(-1)
	return ts
}

// get sends a GET for url on agent's pool under pol and reads the body.
func get(ps *Pools[*int], agent string, pol *int, url string) error {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return err
	}
	res, err := ps.RoundTrip(agent, pol, false, req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	return err
}

// TestPoolsOfAForgottenAgent: a forgotten agent's requests still under
// way ride its pools, which are dropped once they hold no connection,
// rather than kept for an agent that is gone; the agent made again gets
// a pool of its own.
func TestPoolsOfAForgottenAgent(t *testing.T) {
	held, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		<-release
	}))
	t.Cleanup(srv.Close)
	ps := poolsForLoopback(t)
	pol := new(int)

	first := poolOf(ps, "a", pol)
	done := make(chan error, 1)
	go func() { done <- get(ps, "a", pol, srv.URL) }()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the request was not held")
	}
	ps.Forget("a")
	assert.Same(t, first, poolOf(ps, "a", pol), "a request of the forgotten agent's, under way, was given a new pool")
	release <- struct{}{}
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { return first.Open() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the connection, idle after Forget, was kept")

	assert.Eventually(t, func() bool {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		return len(ps.m) == 0
	}, 5*sweepEvery, 10*time.Millisecond, "the forgotten agent's pools outlived their connections")
	assert.NotSame(t, first, poolOf(ps, "a", new(int)), "the agent made again rode the forgotten one's pool")
}

// TestRetiredPoolKeptWhileARequestHoldsIt: a pool a request took before
// its agent's policy changed is not dropped, though it holds no
// connection yet, so that the connection the request then dials is one
// CloseIdle and Forget close once it is idle.
func TestRetiredPoolKeptWhileARequestHoldsIt(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	for _, end := range []string{"CloseIdle", "Forget"} {
		ps := poolsForLoopback(t)
		before, after := new(int), new(int)
		old := ps.take("a", before) // a request, on its way to dial
		require.NoError(t, get(ps, "a", after, srv.URL), "a request under the new policy")
		ps.CloseIdle("a") // another's Admit at the bound
		req, err := http.NewRequest("GET", srv.URL, nil)
		require.NoError(t, err)
		res, err := old.For(false).RoundTrip(req)
		require.NoError(t, err)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		old.users.Add(-1)
		require.Eventually(t, func() bool { return old.Open() == 1 }, 5*time.Second, 10*time.Millisecond, "the request's connection, idle")

		if end == "CloseIdle" {
			ps.CloseIdle("a")
		} else {
			ps.Forget("a")
		}
		assert.Zero(t, old.Open(), "%s did not reach the retired pool's idle connection", end)
	}
}

// TestRetiredPoolsAreSwept: the connection of a request that took a pool
// before its agent's policy changed is closed once it is idle, with no
// CloseIdle or Forget to reach it, over HTTP/1 (dialled after the pool
// was retired) and HTTP/2 (its stream under way then); the new policy's
// pool keeps its idle connection.
func TestRetiredPoolsAreSwept(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		held, release := make(chan struct{}, 1), make(chan struct{})
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/held" {
				held <- struct{}{}
				<-release
			}
			io.WriteString(w, r.Proto)
		}))
		cfg := Config{}
		if h2 {
			srv.EnableHTTP2 = true
			srv.StartTLS()
			cfg.HTTP2, cfg.RootCAs = true, certPool(srv)
		} else {
			srv.Start()
		}
		t.Cleanup(srv.Close)
		ps := poolsFor(t, cfg)
		before, after := new(int), new(int)
		old := ps.take("a", before) // a request under the old policy
		done := make(chan error, 1)
		go func() {
			defer old.users.Add(-1)
			if !h2 { // HTTP/1's request dials after the pool is retired
				<-release
			}
			done <- roundTrip(old, srv.URL+"/held", h2)
		}()
		if h2 {
			<-held
		}
		require.NoError(t, get(ps, "a", after, srv.URL), "a request under the new policy")
		if h2 {
			release <- struct{}{}
		} else {
			close(release)
			<-held
		}
		require.NoError(t, <-done)

		assert.Eventually(t, func() bool { return old.Open() == 0 }, 5*sweepEvery, 10*time.Millisecond,
			"the retired pool's connection (HTTP/2: %v) stayed open once idle", h2)
		assert.Equal(t, int64(1), poolOf(ps, "a", after).Open(), "the live pool's idle connection was swept")
	}
}

// roundTrip sends a GET for url on ts and reads the body, which names the
// protocol the server spoke, as h2 expects.
func roundTrip(ts *Transports, url string, h2 bool) error {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return err
	}
	res, err := ts.For(false).RoundTrip(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	proto, err := io.ReadAll(res.Body)
	if err == nil && (string(proto) == "HTTP/2.0") != h2 {
		err = fmt.Errorf("the server spoke %s", proto)
	}
	return err
}

// certPool trusts srv's certificate.
func certPool(srv *httptest.Server) *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return pool
}
