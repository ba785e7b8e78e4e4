//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/vault"
)

const consoleCanary = "sk-canary-value-that-never-shows-0f3a"

// consoleWorld is a server with what the console reads (agents, a log,
// a vault with a secret attached, approvals) and the console in front of
// it; no network of agents.
type consoleWorld struct {
	t     testing.TB
	s     *server
	srv   *httptest.Server
	token string
}

func newConsoleWorld(t testing.TB, agents int) *consoleWorld {
	t.Helper()
	dir := t.TempDir()
	key, err := vault.NewKey()
	require.NoError(t, err)
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{PlaceholderPrefix: "agenthold"})
	require.NoError(t, err)
	s := &server{
		cfg: Config{DataDir: dir}, log: slog.New(slog.DiscardHandler), elog: &egresslog.Log{Keep: 5000, KeepDenied: 5000},
		agents: newAgents(dir), vault: v, approvals: &approval.Broker{}, proxy: &tproxy.Proxy{},
		servers: lifecycle.New(t.Context()),
	}
	s.approvals.OnAlways = s.addEntry
	rule, _ := vault.Preset("anthropic")
	require.NoError(t, v.Set(vault.Secret{Name: "anthropic", Rule: rule}, []byte(consoleCanary)))
	for i := range agents {
		name := fmt.Sprintf("agent%d", i)
		_, err := s.addAgent(t.Context(), AgentSpec{Name: name, Remote: true, TokenHash: "x", Policy: PolicySpec{Mode: "ask", Allow: []string{"github.com"}}})
		require.NoError(t, err)
		_, err = v.Attach(name, "anthropic", "ANTHROPIC_API_KEY")
		require.NoError(t, err)
	}
	c, err := newConsole(s)
	require.NoError(t, err)
	s.console = c
	srv := httptest.NewServer(c.routes())
	t.Cleanup(srv.Close)
	token, err := s.newUIToken()
	require.NoError(t, err)
	return &consoleWorld{t: t, s: s, srv: srv, token: token}
}

// client is a browser-like client: cookies kept, redirects not followed.
func (w *consoleWorld) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (w *consoleWorld) do(c *http.Client, method, path string, form url.Values) (*http.Response, string) {
	w.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, w.srv.URL+path, body)
	require.NoError(w.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.Do(req)
	require.NoError(w.t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login logs c in and returns the session's CSRF token.
func (w *consoleWorld) login(c *http.Client) string {
	w.t.Helper()
	resp, _ := w.do(c, "POST", "/login", url.Values{"token": {w.token}})
	require.Equal(w.t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(w.t, "/agents", resp.Header.Get("Location"))
	_, page := w.do(c, "GET", "/agents", nil)
	_, after, ok := strings.Cut(page, `data-csrf="`)
	require.True(w.t, ok, "no CSRF token on the page")
	csrf, _, _ := strings.Cut(after, `"`)
	require.NotEmpty(w.t, csrf)
	return csrf
}

func TestConsoleLogin(t *testing.T) {
	w := newConsoleWorld(t, 2)
	c := w.client()
	resp, _ := w.do(c, "GET", "/agents", nil)
	assert.Equal(t, "/login", resp.Header.Get("Location"), "a page without logging in")
	resp, _ = w.do(c, "POST", "/login", url.Values{"token": {"guess"}})
	assert.Equal(t, "/login?failed", resp.Header.Get("Location"))
	resp, _ = w.do(c, "POST", "/login", url.Values{"token": {w.token}})
	require.Equal(t, "/agents", resp.Header.Get("Location"))
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == sessionCookie {
			cookie = ck
		}
	}
	require.NotNil(t, cookie)
	assert.True(t, cookie.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	resp, page := w.do(c, "GET", "/agents", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	assert.Contains(t, page, "agent1")
	assert.Contains(t, page, "anthropic as $ANTHROPIC_API_KEY", "secrets by name")
	assert.NotContains(t, page, "<script>", "no inline script")

	// A new token ends every session.
	_, err := w.s.newUIToken()
	require.NoError(t, err)
	resp, _ = w.do(c, "GET", "/agents", nil)
	assert.Equal(t, "/login", resp.Header.Get("Location"))
}

// TestConsoleChangesNeedCSRF: every change needs the session's CSRF token,
// and none is possible after logout.
func TestConsoleChangesNeedCSRF(t *testing.T) {
	w := newConsoleWorld(t, 1)
	c := w.client()
	csrf := w.login(c)
	held := make(chan policy.Decision, 1)
	pol := w.s.agents.get("agent0").policy.Load()
	go func() {
		held <- policy.Ask(context.Background(), w.s.approvals, "agent0", pol.Decide("docs.example", 443), 443, "tls", nil)
	}()
	var id string
	require.Eventually(t, func() bool {
		p := w.s.approvals.Pending()
		if len(p) == 1 {
			id = p[0].ID
		}
		return id != ""
	}, 5*time.Second, time.Millisecond)
	_, page := w.do(c, "GET", "/approvals", nil)
	assert.Contains(t, page, "docs.example")
	for _, form := range []url.Values{{"answer": {"always"}}, {"answer": {"always"}, "csrf": {"wrong"}}} {
		resp, _ := w.do(c, "POST", "/approvals/"+id, form)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a change without the CSRF token")
	}
	resp, _ := w.do(c, "POST", "/suggest", url.Values{"agent": {"agent0"}})
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, _ = w.do(c, "POST", "/approvals/"+id, url.Values{"answer": {"always"}, "csrf": {csrf}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.True(t, (<-held).Allowed, "approved from the console")
	assert.Contains(t, w.s.agents.specOf(w.s.agents.get("agent0")).Policy.Allow, "docs.example", "always added the entry")

	resp, _ = w.do(c, "POST", "/logout", url.Values{"csrf": {csrf}})
	assert.Equal(t, "/login", resp.Header.Get("Location"))
	resp, _ = w.do(c, "POST", "/suggest", url.Values{"agent": {"agent0"}, "csrf": {csrf}})
	assert.Equal(t, "/login", resp.Header.Get("Location"), "a change after logout")
}

// TestConsoleLiveTraffic: a denial reaches the traffic page's stream as it
// is recorded, with the line that would allow it.
func TestConsoleLiveTraffic(t *testing.T) {
	w := newConsoleWorld(t, 1)
	c := w.client()
	w.login(c)
	next := w.follow(c, "/traffic/events")
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindTLS, Host: "pastebin.com", Port: 443, Reason: policy.ReasonNoRule})
	data := next()
	assert.Contains(t, data, `"host":"pastebin.com"`)
	assert.Contains(t, data, `"allow_command":"agenthold policy set agent0 --mode ask --allow 'github.com' --allow 'pastebin.com'"`)
}

// TestConsoleOffersNoLineForAMadeUpHost: a denied host that is no
// canonical name or address (bytes an agent sent as a CONNECT target or a
// DNS name) is shown, with no line to copy: no allow entry could be made
// of it, and the line would be pasted into a shell.
func TestConsoleOffersNoLineForAMadeUpHost(t *testing.T) {
	w := newConsoleWorld(t, 1)
	c := w.client()
	w.login(c)
	next := w.follow(c, "/traffic/events")
	for _, host := range []string{"x';id>pwned;'.test", `x\'&touch${IFS}pwned&#.test`, "Upper.Example", "trailing.dot."} {
		w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindConnect, Host: host, Port: 443, Reason: "host is not a valid name or address"})
		var ev struct {
			Host    string `json:"host"`
			Command string `json:"allow_command"`
		}
		require.NoError(t, json.Unmarshal([]byte(next()), &ev))
		assert.Equal(t, host, ev.Host)
		assert.Empty(t, ev.Command, "a line offered for %q", host)
	}
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindTCP, Host: "203.0.113.7", Port: 22, Reason: policy.ReasonNoRule})
	assert.Contains(t, next(), `--allow '203.0.113.7:22'`, "an address is an entry")
}

// follow opens an event stream of the console as c, once it has said it
// is connected, and returns what reads its next event's data.
func (w *consoleWorld) follow(c *http.Client, path string) (next func() string) {
	w.t.Helper()
	req, _ := http.NewRequestWithContext(w.t.Context(), "GET", w.srv.URL+path, nil)
	resp, err := c.Do(req)
	require.NoError(w.t, err)
	w.t.Cleanup(func() { resp.Body.Close() })
	assert.Equal(w.t, "text/event-stream", resp.Header.Get("Content-Type"))
	lines := bufio.NewScanner(resp.Body)
	require.True(w.t, lines.Scan()) // ": connected"
	return func() string {
		for lines.Scan() {
			if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
				return data
			}
		}
		require.Fail(w.t, "no event on "+path)
		return ""
	}
}

// TestConsoleShowsNoSecret: no page and no stream carries a secret's
// value, even when a record or an approval names what an agent sent.
func TestConsoleShowsNoSecret(t *testing.T) {
	w := newConsoleWorld(t, 2)
	c := w.client()
	w.login(c)
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindHTTP, Host: "api.anthropic.com", Port: 443, Method: "POST", Path: "/v1/messages", Allowed: true, Secret: "anthropic"})
	for _, page := range []string{"/agents", "/traffic", "/approvals", "/suggest?agent=agent0", "/health"} {
		resp, body := w.do(c, "GET", page, nil)
		assert.Equal(t, http.StatusOK, resp.StatusCode, page)
		assert.NotContains(t, body, consoleCanary, page)
	}
}

// TestConsoleAppliesASuggestion: the suggestions page shows what the
// agent used as a diff, and applying it sets the agent's policy.
func TestConsoleAppliesASuggestion(t *testing.T) {
	w := newConsoleWorld(t, 1)
	c := w.client()
	csrf := w.login(c)
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindTLS, Host: "registry.npmjs.org", Port: 443, Allowed: true, Reason: "approved once by console"})
	_, page := w.do(c, "GET", "/suggest?agent=agent0", nil)
	assert.Contains(t, page, `<span class="added">+ registry.npmjs.org</span>`)
	assert.Contains(t, page, `<span class="removed">- github.com</span>`)
	resp, _ := w.do(c, "POST", "/suggest", url.Values{"agent": {"agent0"}, "csrf": {csrf}, "shown": {shownOn(t, page)}})
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, []string{"registry.npmjs.org"}, w.s.agents.specOf(w.s.agents.get("agent0")).Policy.Allow)
}

// TestConsoleAppliesOnlyWhatItShowed: a suggestion that changed after
// its page was shown (the agent, in report mode, reached another host
// meanwhile) is not applied: the person confirmed what they saw.
func TestConsoleAppliesOnlyWhatItShowed(t *testing.T) {
	w := newConsoleWorld(t, 1)
	require.NoError(t, w.s.setPolicy("agent0", PolicySpec{Mode: "allowlist", Report: true, Allow: []string{"github.com"}}))
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindTLS, Host: "github.com", Port: 443, Allowed: true})
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindTLS, Host: "pypi.org", Port: 443, Allowed: true, Report: true, Reason: policy.ReasonNoRule})
	c := w.client()
	csrf := w.login(c)
	_, page := w.do(c, "GET", "/suggest?agent=agent0", nil)
	require.Contains(t, page, "pypi.org")
	w.s.elog.Record(egresslog.Record{Agent: "agent0", Kind: egresslog.KindTLS, Host: "exfil.example.net", Port: 443, Allowed: true, Report: true, Reason: policy.ReasonNoRule})
	resp, _ := w.do(c, "POST", "/suggest", url.Values{"csrf": {csrf}, "agent": {"agent0"}, "shown": {shownOn(t, page)}})
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Equal(t, []string{"github.com"}, w.s.agents.specOf(w.s.agents.get("agent0")).Policy.Allow, "a policy the person never saw was set")
	resp, _ = w.do(c, "POST", "/suggest", url.Values{"csrf": {csrf}, "agent": {"agent0"}})
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "applied with no suggestion named")
}

// shownOn is the suggestion a suggestions page names for its Apply.
func shownOn(t *testing.T, page string) string {
	t.Helper()
	_, after, ok := strings.Cut(page, `name="shown" value="`)
	require.True(t, ok, "no suggestion named on the page")
	shown, _, _ := strings.Cut(after, `"`)
	return shown
}

// BenchmarkConsolePages renders each page with 100 agents and 5,000
// records each, as a logged-in operator asks for it.
func BenchmarkConsolePages(b *testing.B) {
	w := newConsoleWorld(b, 100)
	for i := range 100 {
		for j := range 5000 {
			w.s.elog.Record(egresslog.Record{Agent: fmt.Sprintf("agent%d", i), Kind: egresslog.KindTLS, Host: fmt.Sprintf("h%d.example", j%300), Port: 443, Allowed: j%7 != 0, Reason: policy.ReasonNoRule})
		}
	}
	c := w.client()
	w.login(c)
	cookie := c.Jar.Cookies(mustURL(b, w.srv.URL))
	h := w.s.console.routes()
	for _, page := range []string{"/agents", "/traffic", "/approvals", "/suggest?agent=agent42", "/health"} {
		b.Run(strings.TrimPrefix(page, "/"), func(b *testing.B) {
			for b.Loop() {
				req := httptest.NewRequest("GET", page, nil)
				for _, ck := range cookie {
					req.AddCookie(ck)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d", page, rec.Code)
				}
			}
		})
	}
}

func mustURL(tb testing.TB, s string) *url.URL {
	u, err := url.Parse(s)
	require.NoError(tb, err)
	return u
}

// TestConsoleApprovalEventsStartWithWhatWaits: the approvals stream's
// first event is what waits when it starts following, so that a request
// raised between the page's drawing and its following is not missed.
func TestConsoleApprovalEventsStartWithWhatWaits(t *testing.T) {
	w := newConsoleWorld(t, 1)
	c := w.client()
	w.login(c)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pol := w.s.agents.get("agent0").policy.Load()
	go policy.Ask(ctx, w.s.approvals, "agent0", pol.Decide("docs.example", 443), 443, "tls", nil)
	require.Eventually(t, func() bool { return len(w.s.approvals.Pending()) == 1 }, 5*time.Second, time.Millisecond)
	id := w.s.approvals.Pending()[0].ID

	assert.JSONEq(t, `{"pending":["`+id+`"]}`, w.follow(c, "/approvals/events")(), "the first event")
}
