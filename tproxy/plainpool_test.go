package tproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// TestPlainRequestsRideOnlyTheirOwnPool: a kept-alive upstream connection
// was checked, when it was dialled, against the per-address rules of the
// policy it was dialled under, and no request is checked again on it. So
// a request of an agent whose policy denies the address (web.test's
// 127.0.0.9) is refused, on the explicit proxy, after another agent's
// request to it left a connection kept alive, and after its own request
// did, under the policy it had before.
func TestPlainRequestsRideOnlyTheirOwnPool(t *testing.T) {
	ln := listenLoop(t, "127.0.0.9:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := fmt.Sprintf("http://web.test:%d/", ln.Addr().(*net.TCPAddr).Port)

	mustPolicy := func(allow ...string) *policy.Policy {
		p, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: allow})
		require.NoError(t, err)
		return p
	}
	allows, denies := mustPolicy("web.test:*"), mustPolicy("web.test:*", "!127.0.0.9")
	var polA, polB atomic.Pointer[policy.Policy]
	polA.Store(allows)
	polB.Store(denies)
	a, b := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	guard, err := netguard.New(netguard.Config{Public: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	p := &Proxy{
		Agents: func(src netip.Addr) (string, *policy.Policy, bool) {
			switch src {
			case a:
				return "A", polA.Load(), true
			case b:
				return "B", polB.Load(), true
			}
			return "", nil, false
		},
		Guard:    guard,
		Resolver: testkit.Resolver{"web.test": {netip.MustParseAddr("127.0.0.9")}},
	}
	explicit := listenLoop(t, "127.0.0.1:0")
	go p.ServeExplicit(explicit)
	t.Cleanup(func() { p.Close() })

	get := func(src netip.Addr) int {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 3 * time.Second}
		c, err := d.Dial("tcp", explicit.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n", url)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, get(b), "B alone reached the address its policy denies")
	require.Equal(t, http.StatusOK, get(a))
	assert.Equal(t, http.StatusForbidden, get(b), "B rode A's kept-alive connection")

	polA.Store(denies)
	assert.Equal(t, http.StatusForbidden, get(a), "A rode a connection kept alive under its old policy")
}
