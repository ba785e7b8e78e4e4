package tproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
)

// TestAskModeHoldsUntilAnswered: under a policy in ask mode, a plain HTTP
// request, TLS and a CONNECT to a name no entry allows are held until a
// person answers, then carried out or refused; what an entry refuses is
// never asked about.
func TestAskModeHoldsUntilAnswered(t *testing.T) {
	b := &approval.Broker{Timeout: 5 * time.Second}
	w := newWorld(t, nil, func(p *Proxy) { p.Approver = b })
	w.setPolicy(policy.Config{Ask: true, Allow: []string{"!blocked.test"}})
	answer := func(name string, a approval.Answer) {
		var id string
		require.Eventually(t, func() bool {
			for _, r := range b.Pending() {
				if r.Name == name {
					id = r.ID
					return true
				}
			}
			return false
		}, 5*time.Second, time.Millisecond, "no approval request for %s", name)
		require.NoError(t, b.Answer(id, a, "test", false))
	}

	plain := make(chan string, 1)
	go func() {
		c := w.dial(w.httpAddr)
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.test:%d\r\nConnection: close\r\n\r\n", w.httpAddr.Port())
		b, _ := io.ReadAll(c)
		plain <- string(b)
	}()
	answer("api.test", approval.Once)
	assert.Contains(t, <-plain, "200 OK", "plain HTTP, approved once")

	tlsBody := make(chan error, 1)
	go func() { _, err := w.httpsGet(w.tlsAddr, "other.test"); tlsBody <- err }()
	answer("other.test", approval.Session)
	assert.NoError(t, <-tlsBody, "TLS, approved for the session")
	_, err := w.httpsGet(w.tlsAddr, "other.test")
	assert.NoError(t, err, "the session's answer holds without asking")

	connect := make(chan int, 1)
	go func() {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		if !assert.NoError(t, err) {
			connect <- 0
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "CONNECT svc.test:%d HTTP/1.1\r\nHost: svc.test\r\n\r\n", w.echoAddr.Port())
		line := make([]byte, 12)
		io.ReadFull(c, line)
		var code int
		fmt.Sscanf(strings.TrimPrefix(string(line), "HTTP/1.1 "), "%d", &code)
		connect <- code
	}()
	answer("svc.test", approval.Deny)
	assert.Equal(t, http.StatusForbidden, <-connect, "CONNECT, denied")
	rec := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindConnect && r.Host == "svc.test" })
	assert.Equal(t, policy.ReasonApprovalDenied, rec.Reason)

	_, err = w.httpsGet(w.tlsAddr, "blocked.test")
	assert.Error(t, err, "a deny entry's name")
	c := w.dial(w.httpAddr)
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, _ := io.ReadAll(c)
	assert.Contains(t, string(out), "403", "the metadata address")
	assert.Empty(t, b.Pending(), "neither was asked about")
}

// TestNoLeakAfterManyHeldAndRefused: 10,000 requests held for approval
// and refused, through the explicit proxy, leave no goroutine and no
// descriptor behind.
func TestNoLeakAfterManyHeldAndRefused(t *testing.T) {
	// No cooldown after a refusal, and no bound on the rate of asking:
	// every request here is held and answered.
	b := &approval.Broker{Timeout: 5 * time.Second, MaxPendingPerAgent: 64, MaxWaitingPerAgent: 64, DenyCooldown: time.Nanosecond, AskRate: 1e9}
	w := newWorld(t, nil, func(p *Proxy) { p.Approver = b; p.MaxConnsPerAgent = 10_000 })
	w.setPolicy(policy.Config{Ask: true, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	ctx, cancel := context.WithCancel(t.Context())
	var answerer sync.WaitGroup
	var answered atomic.Int32
	follow := b.Follow(ctx)
	answerer.Go(func() {
		for req := range follow {
			if b.Answer(req.ID, approval.Deny, "test", false) == nil {
				answered.Add(1)
			}
		}
	})
	fds := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	// One round first, so that pools and listeners the proxy keeps exist
	// before counting.
	heldAndRefused(t, w, 64)
	goroutines, descriptors := runtime.NumGoroutine(), fds()
	const n = 10_000
	refused := heldAndRefused(t, w, n)
	cancel()
	answerer.Wait()
	assert.Equal(t, n, refused)
	assert.Greater(t, answered.Load(), int32(n/100), "the requests were held for approval, not refused before")
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= goroutines && fds() <= descriptors }, 10*time.Second, 20*time.Millisecond,
		"goroutines %d -> %d, descriptors %d -> %d", goroutines, runtime.NumGoroutine(), descriptors, fds())
	t.Logf("after %d held and refused: goroutines %d -> %d, descriptors %d -> %d", n, goroutines, runtime.NumGoroutine(), descriptors, fds())
}

// heldAndRefused sends n absolute-form requests for names no entry
// allows, 32 at a time, and returns how many were refused with 403.
func heldAndRefused(t *testing.T, w *world, n int) int {
	var refused atomic.Int32
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := net.Dial("tcp", w.explicit.Addr().String())
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c, "GET http://n%d.test/ HTTP/1.1\r\nHost: n%d.test\r\nConnection: close\r\n\r\n", i%100, i%100)
			line := make([]byte, 12)
			if _, err := io.ReadFull(c, line); err == nil && strings.HasSuffix(string(line), "403") {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	return int(refused.Load())
}

// pendingRequest waits for the approval request for name.
func pendingRequest(t *testing.T, b *approval.Broker, name string) approval.Request {
	t.Helper()
	var got approval.Request
	require.Eventually(t, func() bool {
		for _, r := range b.Pending() {
			if r.Name == name {
				got = r
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond, "no approval request for %s", name)
	return got
}

// TestApprovalMeetsThePolicyOfItsMoment: an answer that comes after the
// operator refused the destination outright (a deny entry added while it
// waited) does not let it through.
func TestApprovalMeetsThePolicyOfItsMoment(t *testing.T) {
	b := &approval.Broker{Timeout: 5 * time.Second}
	w := newWorld(t, nil, func(p *Proxy) { p.Approver = b })
	w.setPolicy(policy.Config{Ask: true})
	res := make(chan error, 1)
	go func() { _, err := w.httpsGet(w.tlsAddr, "other.test"); res <- err }()
	req := pendingRequest(t, b, "other.test")
	w.setPolicy(policy.Config{Ask: true, Allow: []string{"!other.test"}})
	require.NoError(t, b.Answer(req.ID, approval.Once, "webhook", false))
	assert.Error(t, <-res, "reached other.test although a deny entry now refuses it")
}

// TestApprovedConnectionOutlivesAnUnrelatedChange: a policy change that
// still leaves the name to approval does not end a connection approved
// for it.
func TestApprovedConnectionOutlivesAnUnrelatedChange(t *testing.T) {
	b := &approval.Broker{Timeout: 5 * time.Second}
	w := newWorld(t, nil, func(p *Proxy) { p.Approver = b })
	w.setPolicy(policy.Config{Ask: true, Allow: []string{"github.com"}})
	tc := tls.Client(w.dial(w.tlsAddr), &tls.Config{ServerName: "other.test", RootCAs: w.ca.Pool})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	hs := make(chan error, 1)
	go func() { hs <- tc.Handshake() }()
	require.NoError(t, b.Answer(pendingRequest(t, b, "other.test").ID, approval.Session, "alice", false))
	require.NoError(t, <-hs)
	br := bufio.NewReader(tc)
	get := func() error {
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		return err
	}
	require.NoError(t, get())
	w.setPolicy(policy.Config{Ask: true, Allow: []string{"github.com", "unrelated.example"}})
	w.proxy.Rejudge("a1")
	assert.NoError(t, get(), "ended by an unrelated policy change")
	w.setPolicy(policy.Config{Allow: []string{"github.com"}})
	w.proxy.Rejudge("a1")
	assert.Error(t, get(), "kept after the agent left ask mode")
}

// TestConnectApprovalCoversTheRequestsInside: a CONNECT approved once
// carries the plain HTTP requests inside its tunnel, which are for the
// name approved: the person is asked once.
func TestConnectApprovalCoversTheRequestsInside(t *testing.T) {
	b := &approval.Broker{Timeout: 2 * time.Second}
	w := newWorld(t, nil, func(p *Proxy) { p.Approver = b })
	w.setPolicy(policy.Config{Ask: true})
	out := make(chan string, 1)
	go func() {
		c, err := net.Dial("tcp", w.explicit.Addr().String())
		if err != nil {
			out <- err.Error()
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(8 * time.Second))
		fmt.Fprintf(c, "CONNECT svc.test:%d HTTP/1.1\r\nHost: svc.test\r\n\r\n", w.httpAddr.Port())
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil || resp.StatusCode != http.StatusOK {
			out <- fmt.Sprint("CONNECT: ", err, resp)
			return
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: svc.test:%d\r\nConnection: close\r\n\r\n", w.httpAddr.Port())
		body, _ := io.ReadAll(br)
		out <- string(body)
	}()
	require.NoError(t, b.Answer(pendingRequest(t, b, "svc.test").ID, approval.Once, "alice", false))
	assert.Contains(t, <-out, "200 OK", "the request inside the approved tunnel")
	assert.Empty(t, b.Pending(), "asked again inside the tunnel")
}
