package mitm

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/vault"
)

// refreshBehindTproxy is a rig whose requests to api.test/oauth/token a
// RefreshExchange hook answers, after a hook that says on reached that a
// request came to the hooks; a token endpoint that counts the grants it
// gets; and tproxy in front, so that Rejudge reaches the requests. It
// returns the agent's connection, through tproxy, and its refresh
// token's placeholder.
func refreshBehindTproxy(t *testing.T) (r *rig, p *tproxy.Proxy, c *tls.Conn, grants *atomic.Int32, reached chan struct{}, placeholder string) {
	r = newRig(t)
	pol, err := policy.New(policy.Config{Allow: []string{"POST api.test:*/oauth/token", "GET api.test:*/public/*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(t, err)
	r.changed.Store(pol)
	grants = new(atomic.Int32)
	r.mux.HandleFunc("/oauth/token", func(w http.ResponseWriter, req *http.Request) {
		io.Copy(io.Discard, req.Body)
		grants.Add(1)
		json.NewEncoder(w).Encode(map[string]any{"access_token": "AT-new-real", "refresh_token": "RT-new-real"})
	})
	rule := vault.Rule{Hosts: []string{"api.test"}, Header: "Authorization", Mode: vault.Refresh, Paths: []string{"/oauth/token"}}
	require.NoError(t, r.vault.Set(vault.Secret{Name: "refresh", Rule: rule}, []byte("RT-1-real")))
	r.vault.Detach("a1", "api")
	a, err := r.vault.Attach("a1", "refresh", "REFRESH")
	require.NoError(t, err)
	x := &RefreshExchange{Host: fmt.Sprintf("api.test:%d", r.upPort), Path: "/oauth/token", RefreshSecret: "refresh", Store: r.vault, Client: r.ic.Client(false)}
	reached = make(chan struct{}, 1)
	r.ic.Hooks = []Hook{func(http.ResponseWriter, *http.Request, string) bool { reached <- struct{}{}; return false }, x.Hook()}
	p, addr := r.interceptingTProxy(t)
	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	c = tls.Client(raw, &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	c.SetDeadline(time.Now().Add(10 * time.Second))
	require.NoError(t, c.Handshake())
	return r, p, c, grants, reached, a.Placeholder
}

// TestHookedRequestEndsOnRejudge: a request a hook answers (a refresh
// grant, whose real token the hook sends on) is registered with the
// block that handed over its connection before the hooks see it, as a
// forwarded one is: a policy change that refuses it while its body comes
// ends it, and the grant never reaches the token endpoint. Hooks ran
// before the registration, and the refused grant went out.
func TestHookedRequestEndsOnRejudge(t *testing.T) {
	r, p, c, grants, reached, placeholder := refreshBehindTproxy(t)
	body := `{"grant_type":"refresh_token","refresh_token":"` + placeholder + `","pad":"` + strings.Repeat("x", 1000) + `"}`
	fmt.Fprintf(c, "POST /oauth/token HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)-10])
	select {
	case <-reached:
	case <-time.After(5 * time.Second):
		require.FailNow(t, "the request never reached the hooks")
	}
	refusing, err := policy.New(policy.Config{Allow: []string{"GET api.test:*/public/*"}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(t, err)
	r.changed.Store(refusing)
	p.Rejudge("a1")
	io.WriteString(c, body[len(body)-10:])
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
		assert.NotEqual(t, http.StatusOK, resp.StatusCode, "the refused grant was answered")
	}
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/oauth/token" })
	assert.Zero(t, grants.Load(), "the refused grant reached the token endpoint")
	assert.Equal(t, tproxy.ReasonPolicyChanged+policy.ReasonNoRequestRule, rec.Reason, "record %+v", rec)
}

// TestHookedRequestCounted: a request a hook answers is recorded with
// its head and the body the hook read.
func TestHookedRequestCounted(t *testing.T) {
	r, _, c, grants, reached, placeholder := refreshBehindTproxy(t)
	go func() {
		for range reached {
		}
	}()
	t.Cleanup(func() { close(reached) })
	body := `{"grant_type":"refresh_token","refresh_token":"` + placeholder + `","pad":"` + strings.Repeat("x", 60<<10) + `"}`
	head := fmt.Sprintf("POST /oauth/token HTTP/1.1\r\nHost: api.test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	io.WriteString(c, head+body)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.EqualValues(t, 1, grants.Load())
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/oauth/token" })
	assert.GreaterOrEqual(t, rec.BytesUp, int64(len(head)+len(body)), "record %+v", rec)
}
