package tproxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// TestExplicitRequestsCountAsConnections: absolute-form requests on the
// explicit proxy take a connection slot each while in flight, so an
// agent's cap bounds what it has going upstream however it asks.
func TestExplicitRequestsCountAsConnections(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.MaxConnsPerAgent = 2 })
	release := make(chan struct{})
	var upstream, peak atomic.Int32
	backend := listenLoop(t, "127.0.0.2:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := upstream.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		upstream.Add(-1)
		fmt.Fprint(rw, "ok")
	})}
	go srv.Serve(backend)
	t.Cleanup(func() { srv.Close() })
	url := fmt.Sprintf("http://api.test:%d/", backend.Addr().(*net.TCPAddr).Port)

	var wg sync.WaitGroup
	statuses := make(chan string, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", w.explicit.Addr().String())
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n", url)
			line := make([]byte, 12)
			io.ReadFull(c, line)
			statuses <- string(line)
		}()
	}
	require.Eventually(t, func() bool { return len(statuses) == 8 }, 5*time.Second, 10*time.Millisecond, "requests over the cap are refused at once")
	assert.EqualValues(t, 2, upstream.Load(), "two requests in flight upstream")
	close(release)
	wg.Wait()
	close(statuses)
	refused := 0
	for s := range statuses {
		if strings.Contains(s, "503") {
			refused++
		}
	}
	assert.Equal(t, 8, refused)
	assert.EqualValues(t, 2, peak.Load(), "never more than the cap upstream at once")
	w.waitRecord(func(r egresslog.Record) bool {
		return r.Kind == egresslog.KindHTTP && r.Reason == ReasonAgentTooManyConns
	})
}

// TestConnectionRateQuota: an agent opening connections faster than its
// quota is refused beyond its burst, with a record saying why.
func TestConnectionRateQuota(t *testing.T) {
	w := newWorld(t, nil, nil)
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{ConnectionsPerSecond: 5}}) // bursts of 10
	served := 0
	for range 30 {
		if echoThrough2(w) == nil {
			served++
		}
	}
	assert.GreaterOrEqual(t, served, 10, "the burst is served")
	assert.LessOrEqual(t, served, 15, "beyond the burst, the rate")
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Reason == policy.ReasonQuotaConnections })
	assert.Equal(t, "a1", rec.Agent)
}

func echoThrough2(w *world) error {
	w.origDst.Store(w.echoAddr)
	return echoThrough(w.tproxyLn.Addr().String())
}

// TestByteRateQuota: a download is held to the agent's bytes per second.
// The bound checked is a lower one: a slower machine only takes longer.
func TestByteRateQuota(t *testing.T) {
	w := newWorld(t, nil, nil)
	const size, rate = 3 << 20, 1 << 20
	w.setPolicy(policy.Config{Mode: policy.Open, Quotas: policy.Quotas{BytesPerSecondDown: rate}})
	big := listenLoop(t, "127.0.0.2:0")
	go acceptLoop(big, func(c net.Conn) {
		defer c.Close()
		c.Write(bytes.Repeat([]byte("x"), size))
	})
	c := w.dial(addrPortOf(big.Addr()))
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	require.NoError(t, err)
	assert.EqualValues(t, size, n)
	// A second's burst, then two seconds at the rate.
	assert.Greater(t, time.Since(start), 1500*time.Millisecond, "3 MiB at 1 MiB/s took less than 1.5 s")
}

// TestInterceptRefusedForQuota: a connection the Interceptor refused for a
// quota is recorded as a denial with the quota's reason, not as an
// intercepted connection that failed.
func TestInterceptRefusedForQuota(t *testing.T) {
	ic := &interceptor{err: fmt.Errorf("mitm: client TLS handshake for api.test: %w", &policy.QuotaError{Reason: policy.ReasonQuotaMints})}
	w := newWorld(t, []string{"api.test:*"}, func(p *Proxy) { p.Interceptor = ic })
	w.httpsGet(w.tlsAddr, "api.test")
	r := w.waitRecord(func(r egresslog.Record) bool { return r.Host == "api.test" && r.Kind == egresslog.KindTLS })
	assert.False(t, r.Allowed, "record %+v", r)
	assert.Equal(t, policy.ReasonQuotaMints, r.Reason)
}
