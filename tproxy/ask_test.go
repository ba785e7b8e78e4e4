package tproxy

import (
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
