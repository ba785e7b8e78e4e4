package httpfwd

import (
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

// TestPoolsOfAForgottenAgent: a forgotten agent's requests still under
// way ride its pools, which are dropped, by the next Forget, once they
// hold no connection, rather than kept for an agent that is gone; the
// agent made again gets a pool of its own.
func TestPoolsOfAForgottenAgent(t *testing.T) {
	held, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held <- struct{}{}
		<-release
	}))
	t.Cleanup(srv.Close)
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	ps := &Pools[*int]{New: func(string) *Transports { return NewTransports(Config{Guard: guard}) }}
	pol := new(int)

	first := ps.For("a", pol)
	done := make(chan error, 1)
	go func() {
		res, err := (&http.Client{Transport: first.For(false)}).Get(srv.URL)
		if err == nil {
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		done <- err
	}()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the request was not held")
	}
	ps.Forget("a")
	assert.Same(t, first, ps.For("a", pol), "a request of the forgotten agent's, under way, was given a new pool")
	release <- struct{}{}
	require.NoError(t, <-done)
	require.Eventually(t, func() bool { return first.Open() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the connection, idle after Forget, was kept")

	ps.Forget("b")
	ps.mu.Lock()
	assert.Empty(t, ps.m, "the forgotten agent's pools outlived their connections")
	ps.mu.Unlock()
	assert.NotSame(t, first, ps.For("a", new(int)), "the agent made again rode the forgotten one's pool")
}
