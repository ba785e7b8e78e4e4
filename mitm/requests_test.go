package mitm

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/websocket"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// withRequestEntries makes a1's policy judge api.test's requests (a
// credential host) and other.test's (a host no credential claims) one by
// one.
func withRequestEntries(t *testing.T, r *rig) {
	p, err := policy.New(policy.Config{Allow: []string{
		"GET,HEAD api.test:*/public/*",
		"POST api.test:*/v1/chat",
		"GET api.test:*/ws/allowed",
		"!DELETE api.test:*/**",
		"GET other.test:*/ok",
	}, Quotas: policy.Quotas{ConnectionsPerSecond: -1}})
	require.NoError(t, err)
	r.changed.Store(p)
}

// TestRequestEntriesIntercepted: on an intercepted connection, HTTP/1.1
// kept alive or HTTP/2, each request is judged by its method and path;
// a refusal is 403 with Proxy-Status naming the reason and the entry, and
// a record with the method, path and entry; the allowed ones on the same
// connection go through, the secret injected.
func TestRequestEntriesIntercepted(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) {
			r := newRig(t)
			withRequestEntries(t, r)
			c := r.client(r.addr, h2)
			for _, tc := range []struct {
				method, path string
				status       int
				proxyStatus  string
			}{
				{"GET", "/public/readme", http.StatusOK, ""},
				{"POST", "/public/readme", http.StatusForbidden, policy.ReasonNoRequestRule},
				{"POST", "/v1/chat", http.StatusOK, ""},
				{"GET", "/public/%2e%2e/admin", http.StatusForbidden, policy.ReasonPathDotSegment},
				{"DELETE", "/public/readme", http.StatusForbidden, "a deny entry matches: !DELETE api.test:*/**"},
				{"HEAD", "/public/readme", http.StatusOK, ""},
			} {
				req, err := http.NewRequest(tc.method, "https://api.test"+tc.path, strings.NewReader(""))
				require.NoError(t, err)
				req.URL.RawPath = tc.path // as written, escapes kept
				req.Header.Set("Authorization", "Bearer "+r.ph)
				resp, err := c.Do(req)
				require.NoError(t, err, "%s %s", tc.method, tc.path)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, tc.status, resp.StatusCode, "%s %s", tc.method, tc.path)
				assert.Equal(t, h2, resp.ProtoMajor == 2, "protocol")
				if tc.proxyStatus != "" {
					assert.Contains(t, resp.Header.Get("Proxy-Status"), tc.proxyStatus, "%s %s", tc.method, tc.path)
				} else {
					assert.Equal(t, "Bearer "+secretValue, r.upstreamHeader().Get("Authorization"), "the secret, injected")
				}
			}
			rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Method == "DELETE" })
			assert.False(t, rec.Allowed)
			assert.Equal(t, "/public/readme", rec.Path)
			assert.Equal(t, "!DELETE api.test:*/**", rec.Rule)
			assert.Equal(t, policy.ReasonDenyEntry, rec.Reason)
			rec = r.waitRecord(func(rec egresslog.Record) bool { return rec.Method == "POST" && rec.Allowed })
			assert.Equal(t, "POST api.test:*/v1/chat", rec.Rule)
		})
	}
}

// TestRequestEntriesOnAHostNoCredentialClaims: a host intercepted only
// because its requests are judged gets the same judgement.
func TestRequestEntriesOnAHostNoCredentialClaims(t *testing.T) {
	r := newRig(t)
	withRequestEntries(t, r)
	c := r.client(r.serveIntercepted("other.test"), true)
	resp, body := r.get(c, "https://other.test/ok", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = r.get(c, "https://other.test/admin", nil)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	assert.Contains(t, resp.Header.Get("Proxy-Status"), policy.ReasonNoRequestRule)
}

// TestWebSocketUpgradeJudgedByPath: an upgrade is a request like any
// other, judged by its path before anything is relayed.
func TestWebSocketUpgradeJudgedByPath(t *testing.T) {
	r := newRig(t)
	withRequestEntries(t, r)
	r.mux.Handle("/ws/", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	dial := func(path string) error {
		cfg, err := websocket.NewConfig("wss://api.test"+path, "https://api.test/")
		require.NoError(t, err)
		cfg.TlsConfig = &tls.Config{RootCAs: rootPool(r.ca), ServerName: "api.test"}
		raw, err := net.Dial("tcp", r.addr)
		require.NoError(t, err)
		ws, err := websocket.NewClient(cfg, tls.Client(raw, cfg.TlsConfig))
		if err != nil {
			raw.Close()
			return err
		}
		return ws.Close()
	}
	assert.NoError(t, dial("/ws/allowed"))
	assert.Error(t, dial("/ws/other"), "an upgrade on a path no entry allows")
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Path == "/ws/other" })
	assert.False(t, rec.Allowed)
	assert.Equal(t, policy.ReasonNoRequestRule, rec.Reason)
}
