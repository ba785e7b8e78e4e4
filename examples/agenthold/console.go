//go:build linux

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
	"github.com/agenthold/egress/policy/learn"
)

// The console: a web page an operator reads the gateway from (agents,
// live traffic, approvals, suggestions, health) on its own listener
// (ui_listen, loopback only), behind a login token (agenthold ui token,
// stored hashed), a session cookie (HttpOnly, SameSite=Strict) and a
// CSRF token on every change, with a strict Content-Security-Policy.
// Everything it serves is embedded; it shows what the admin API shows,
// and so never a secret's value.

//go:embed console
var consoleFiles embed.FS

const (
	sessionCookie = "agenthold_session"
	sessionLife   = 12 * time.Hour
	maxSessions   = 64
	// trafficRows is how many records the traffic page starts with.
	trafficRows = 200
)

// consoleCSP lets the pages load only their own script, style and the
// events they subscribe to, in no frame.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

type console struct {
	s     *server
	pages map[string]*template.Template

	mu       sync.Mutex
	sessions map[string]consoleSession // by the SHA-256 of the cookie's value
	minutes  [healthMinutes]minuteCounts
}

type consoleSession struct {
	csrf    string
	expires time.Time
}

// tokenPath is where the console's login token is kept, hashed.
func (s *server) tokenPath() string { return filepath.Join(s.cfg.DataDir, "ui-token.sha256") }

// startConsole serves the console on ui_listen, if set.
func (s *server) startConsole() error {
	if s.cfg.UIListen == "" {
		return nil
	}
	c, err := newConsole(s)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.UIListen)
	if err != nil {
		return fmt.Errorf("ui_listen: %w", err)
	}
	srv := &http.Server{Handler: c.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.console = c
	fl := s.elog.Follow(s.servers.Context(), egresslog.Filter{}, 4096)
	go c.countMinutes(fl)
	s.servers.Go("console", func() error { return srv.Serve(ln) }, http.ErrServerClosed)
	s.servers.OnStop("console counts", func(context.Context) error { fl.Close(); return nil })
	s.servers.OnStop("console", srv.Shutdown)
	s.log.Info("console serving", "ui_listen", ln.Addr().String())
	return nil
}

func newConsole(s *server) (*console, error) {
	c := &console{s: s, pages: map[string]*template.Template{}, sessions: map[string]consoleSession{}}
	funcs := template.FuncMap{"join": strings.Join, "sub100": func(n int) int { return 100 - n }, "answers": func() []approval.Answer {
		return []approval.Answer{approval.Once, approval.Session, approval.Always, approval.Deny}
	}, "ago": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return time.Since(t).Round(time.Second).String() + " ago"
	}}
	for _, page := range []string{"login", "agents", "traffic", "approvals", "suggest", "health"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(consoleFiles, "console/layout.html", "console/"+page+".html")
		if err != nil {
			return nil, err
		}
		c.pages[page] = t
	}
	return c, nil
}

func (c *console) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(consoleFiles, "console/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	authed := func(h func(http.ResponseWriter, *http.Request, consoleSession)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			sess, ok := c.session(r)
			if !ok {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			if r.Method == http.MethodPost && !c.csrfOK(r, sess) {
				http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
				return
			}
			h(w, r, sess)
		}
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/agents", http.StatusSeeOther) })
	mux.HandleFunc("POST /logout", authed(c.logout))
	mux.HandleFunc("GET /agents", authed(c.agentsPage))
	mux.HandleFunc("GET /traffic", authed(c.trafficPage))
	mux.HandleFunc("GET /traffic/events", authed(c.trafficEvents))
	mux.HandleFunc("GET /approvals", authed(c.approvalsPage))
	mux.HandleFunc("GET /approvals/events", authed(c.approvalEvents))
	mux.HandleFunc("POST /approvals/{id}", authed(c.answer))
	mux.HandleFunc("GET /suggest", authed(c.suggestPage))
	mux.HandleFunc("POST /suggest", authed(c.applySuggestion))
	mux.HandleFunc("GET /health", authed(c.healthPage))
	return securityHeaders(mux)
}

// securityHeaders adds to every answer what keeps a page to itself.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", consoleCSP)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// newUIToken makes the console's login token, keeps its hash, ends every
// session, and returns the token (shown once).
func (s *server) newUIToken() (string, error) {
	token := rand.Text()
	sum := sha256.Sum256([]byte(token))
	if err := os.WriteFile(s.tokenPath(), []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		return "", err
	}
	if s.console != nil {
		s.console.mu.Lock()
		clear(s.console.sessions)
		s.console.mu.Unlock()
	}
	return token, nil
}

// tokenOK reports whether token is the console's.
func (c *console) tokenOK(token string) bool {
	stored, err := os.ReadFile(c.s.tokenPath())
	if err != nil || token == "" {
		return false
	}
	want, err := hex.DecodeString(strings.TrimSpace(string(stored)))
	sum := sha256.Sum256([]byte(token))
	return err == nil && len(want) == len(sum) && subtle.ConstantTimeCompare(want, sum[:]) == 1
}

func sessionKey(cookie string) string {
	sum := sha256.Sum256([]byte(cookie))
	return hex.EncodeToString(sum[:])
}

func (c *console) session(r *http.Request) (consoleSession, bool) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return consoleSession{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sess, ok := c.sessions[sessionKey(ck.Value)]
	if !ok || time.Now().After(sess.expires) {
		delete(c.sessions, sessionKey(ck.Value))
		return consoleSession{}, false
	}
	return sess, true
}

// csrfOK checks a change's CSRF token: the form's csrf field or the
// X-CSRF-Token header, against the session's.
func (c *console) csrfOK(r *http.Request, sess consoleSession) bool {
	got := r.Header.Get("X-CSRF-Token")
	if got == "" {
		got = r.PostFormValue("csrf")
	}
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, "login", consoleSession{}, map[string]any{"Failed": r.URL.Query().Has("failed")})
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if !c.tokenOK(r.PostFormValue("token")) {
		http.Redirect(w, r, "/login?failed", http.StatusSeeOther)
		return
	}
	cookie := rand.Text() + rand.Text()
	c.mu.Lock()
	now := time.Now()
	for k, sess := range c.sessions {
		if now.After(sess.expires) {
			delete(c.sessions, k)
		}
	}
	if len(c.sessions) >= maxSessions {
		c.mu.Unlock()
		http.Error(w, "too many sessions: log out elsewhere, or make a new token", http.StatusServiceUnavailable)
		return
	}
	c.sessions[sessionKey(cookie)] = consoleSession{csrf: rand.Text(), expires: now.Add(sessionLife)}
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: cookie, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: int(sessionLife / time.Second)})
	http.Redirect(w, r, "/agents", http.StatusSeeOther)
}

func (c *console) logout(w http.ResponseWriter, r *http.Request, _ consoleSession) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.mu.Lock()
		delete(c.sessions, sessionKey(ck.Value))
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (c *console) render(w http.ResponseWriter, page string, sess consoleSession, data map[string]any) {
	data["Page"], data["CSRF"] = page, sess.csrf
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.pages[page].Execute(w, data); err != nil {
		c.s.log.Warn("console page", "page", page, "err", err)
	}
}

// agentRow is one agent on the agents page: what it may do, never a
// secret's value.
type agentRow struct {
	Name, Mode      string
	Allow, Secrets  []string
	Quotas          string
	Records, Denied uint64
	LastSeen        time.Time
	Remote          bool
}

func (c *console) agentsPage(w http.ResponseWriter, _ *http.Request, sess consoleSession) {
	stats := c.s.elog.Stats()
	var rows []agentRow
	for _, a := range c.s.agents.list() {
		info := c.s.info(a)
		st := stats[info.Name]
		row := agentRow{Name: info.Name, Mode: cmpString(info.Policy.Mode, "open"), Allow: info.Policy.Allow, Secrets: info.Secrets,
			Quotas: quotaText(info.Policy.Quotas), Records: st.Records, Denied: st.Denied, Remote: info.Remote}
		if last := c.s.elog.List(egresslog.Filter{Agent: info.Name}, 1); len(last) > 0 {
			row.LastSeen = last[0].Time
		}
		rows = append(rows, row)
	}
	c.render(w, "agents", sess, map[string]any{"Agents": rows})
}

func cmpString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func quotaText(q QuotaSpec) string {
	var parts []string
	for _, f := range quotaFields(&q) {
		if *f.v != 0 {
			parts = append(parts, fmt.Sprintf("%s %g", f.flag, *f.v))
		}
	}
	if parts == nil {
		return "defaults"
	}
	return strings.Join(parts, ", ")
}

// consoleRecord is a record as the traffic page shows it, with the
// policy set line that would allow what was denied.
type consoleRecord struct {
	egresslog.Record
	Allow string
}

// MarshalJSON is the record's JSON form (egresslog's), with the line
// that would allow it as "allow_command".
func (r consoleRecord) MarshalJSON() ([]byte, error) {
	b := r.Record.AppendJSON(nil)
	if r.Allow == "" {
		return b, nil
	}
	cmd, err := json.Marshal(r.Allow)
	if err != nil {
		return nil, err
	}
	b = append(b[:len(b)-1], `,"allow_command":`...)
	return append(append(b, cmd...), '}'), nil
}

// canonicalHost says whether h is a name in its canonical form or an
// address: what an allow entry is made of. A refused host can be any
// bytes an agent sent (a CONNECT target, a DNS name), which no line to
// copy is offered for.
func canonicalHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	n, err := policy.NormalizeName(h)
	return err == nil && n == h
}

func (c *console) withAllow(r egresslog.Record) consoleRecord {
	out := consoleRecord{Record: r}
	if r.Allowed || !canonicalHost(r.Host) || r.Agent == "" || r.Kind == egresslog.KindApproval {
		return out
	}
	a := c.s.agents.get(r.Agent)
	if a == nil {
		return out
	}
	spec := c.s.agents.specOf(a).Policy
	entry := r.Host
	if r.Port != 0 && r.Port != 80 && r.Port != 443 {
		entry = fmt.Sprintf("%s:%d", r.Host, r.Port)
	}
	if !slices.Contains(spec.Allow, entry) {
		spec.Allow = append(slices.Clone(spec.Allow), entry)
	}
	if spec.Mode == "" {
		spec.Mode = "open"
	}
	out.Allow = policySetCommand(r.Agent, spec)
	return out
}

func (c *console) trafficPage(w http.ResponseWriter, _ *http.Request, sess consoleSession) {
	var recs []consoleRecord
	for _, r := range c.s.elog.List(egresslog.Filter{}, trafficRows) {
		recs = append(recs, c.withAllow(r))
	}
	var agents []string
	for _, a := range c.s.agents.list() {
		agents = append(agents, a.spec.Name)
	}
	c.render(w, "traffic", sess, map[string]any{"Records": recs, "Agents": agents})
}

// trafficEvents streams records as they happen (Server-Sent Events), each
// as JSON with the policy set line that would allow a denial.
func (c *console) trafficEvents(w http.ResponseWriter, r *http.Request, _ consoleSession) {
	fl := c.s.elog.Follow(r.Context(), egresslog.Filter{}, 0)
	defer fl.Close()
	c.stream(w, r, func() (any, bool) {
		rec, ok := <-fl.C
		return c.withAllow(rec), ok
	})
}

// stream writes next's values as Server-Sent Events until it ends, the
// client leaves, or the gateway stops.
func (c *console) stream(w http.ResponseWriter, r *http.Request, next func() (any, bool)) {
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	fmt.Fprint(w, ": connected\n\n")
	rc.Flush()
	values := make(chan any)
	go func() {
		defer close(values)
		for {
			v, ok := next()
			if !ok {
				return
			}
			select {
			case values <- v:
			case <-r.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case v, ok := <-values:
			if !ok {
				return
			}
			b, _ := json.Marshal(v)
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			rc.Flush()
		case <-r.Context().Done():
			return
		case <-c.s.servers.Stopping():
			return
		}
	}
}

func (c *console) approvalsPage(w http.ResponseWriter, _ *http.Request, sess consoleSession) {
	c.render(w, "approvals", sess, map[string]any{"Pending": c.s.approvals.Pending()})
}

// approvalEvents says when an approval request is raised, so that the
// page reloads its list. Its first event is what waits once it follows
// (the IDs): a request raised after the page was drawn and before it
// followed is not missed.
func (c *console) approvalEvents(w http.ResponseWriter, r *http.Request, _ consoleSession) {
	raised := c.s.approvals.Follow(r.Context())
	pending := []string{}
	for _, p := range c.s.approvals.Pending() {
		pending = append(pending, p.ID)
	}
	first := true
	c.stream(w, r, func() (any, bool) {
		if first {
			first = false
			return map[string][]string{"pending": pending}, true
		}
		req, ok := <-raised
		return req, ok
	})
}

func (c *console) answer(w http.ResponseWriter, r *http.Request, _ consoleSession) {
	a, err := approval.ParseAnswer(r.PostFormValue("answer"))
	if err == nil {
		err = c.s.answer(r.PathValue("id"), a, "console", r.PostFormValue("deny_entry") == "1")
	}
	if err != nil && !errors.Is(err, approval.ErrNotPending) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	http.Redirect(w, r, "/approvals", http.StatusSeeOther)
}

// suggestion is what the suggestions page shows for an agent: its
// entries now, the suggested ones, and the lines that differ.
type suggestion struct {
	Agent          string
	Added, Removed []string
	Kept           []string
	Attempted      []policy.SuggestedEntry
	Command        string
	// Shown names the policy the page shows (a digest of Command): Apply
	// sets it only if that is still the suggestion, since what the agent
	// did meanwhile changes what is suggested.
	Shown string
}

func (c *console) suggestFor(agent string) (suggestion, PolicySpec, bool) {
	a := c.s.agents.get(agent)
	if a == nil {
		return suggestion{}, PolicySpec{}, false
	}
	current := c.s.agents.specOf(a).Policy
	var obs []policy.Observation
	for _, r := range c.s.elog.List(egresslog.Filter{Agent: agent}, 0) {
		if o, ok := learn.Observation(r); ok {
			obs = append(obs, o)
		}
	}
	s := policy.Suggest(obs, policy.SuggestConfig{})
	next := suggestedSpec(current, s)
	out := suggestion{Agent: agent, Attempted: s.Attempted, Command: policySetCommand(agent, next)}
	digest := sha256.Sum256([]byte(out.Command))
	out.Shown = hex.EncodeToString(digest[:])
	for _, e := range next.Allow {
		if slices.Contains(current.Allow, e) {
			out.Kept = append(out.Kept, e)
		} else {
			out.Added = append(out.Added, e)
		}
	}
	for _, e := range current.Allow {
		if !slices.Contains(next.Allow, e) {
			out.Removed = append(out.Removed, e)
		}
	}
	return out, next, true
}

func (c *console) suggestPage(w http.ResponseWriter, r *http.Request, sess consoleSession) {
	var agents []string
	for _, a := range c.s.agents.list() {
		agents = append(agents, a.spec.Name)
	}
	data := map[string]any{"Agents": agents}
	if s, _, ok := c.suggestFor(r.URL.Query().Get("agent")); ok {
		data["Suggestion"] = s
	}
	c.render(w, "suggest", sess, data)
}

func (c *console) applySuggestion(w http.ResponseWriter, r *http.Request, _ consoleSession) {
	agent := r.PostFormValue("agent")
	s, next, ok := c.suggestFor(agent)
	if !ok {
		http.Error(w, "no such agent", http.StatusNotFound)
		return
	}
	if subtle.ConstantTimeCompare([]byte(s.Shown), []byte(r.PostFormValue("shown"))) != 1 {
		http.Error(w, "the suggestion changed since it was shown (the agent did more meanwhile): look at it again", http.StatusConflict)
		return
	}
	if err := c.s.setPolicy(agent, next); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	http.Redirect(w, r, "/agents", http.StatusSeeOther)
}

// minuteCounts are the records and denials of one minute.
type minuteCounts struct {
	minute          int64 // Unix minutes
	records, denied int
}

// healthMinutes is how far back the health page's chart goes.
const healthMinutes = 30

// countMinutes keeps per-minute counts of what the log records, for the
// health page's chart, until ctx is done. A follower that falls behind
// loses records, and the chart with it: it is a picture, not an account.
func (c *console) countMinutes(fl *egresslog.Follower) {
	for r := range fl.C {
		m := r.Time.Unix() / 60
		c.mu.Lock()
		slot := &c.minutes[m%healthMinutes]
		if slot.minute != m {
			*slot = minuteCounts{minute: m}
		}
		slot.records++
		if !r.Allowed || r.Report {
			slot.denied++
		}
		c.mu.Unlock()
	}
}

// bar is one minute of the chart, in SVG units.
type bar struct {
	X, Records, Denied int
	Label              string
}

// agentHealth is one agent's line on the health page.
type agentHealth struct {
	Name                                    string
	Records, Denied, Quota, Tunnel, Waiting uint64
	Open                                    int
}

func (c *console) healthPage(w http.ResponseWriter, _ *http.Request, sess consoleSession) {
	now := time.Now().Unix() / 60
	var bars []bar
	peak := 1
	c.mu.Lock()
	counts := c.minutes
	c.mu.Unlock()
	for i := range healthMinutes {
		m := now - int64(healthMinutes-1-i)
		slot := counts[m%healthMinutes]
		if slot.minute != m {
			slot = minuteCounts{}
		}
		peak = max(peak, slot.records)
		bars = append(bars, bar{X: i * 10, Records: slot.records, Denied: slot.denied, Label: time.Unix(m*60, 0).Format("15:04")})
	}
	for i := range bars { // scale to 100 units high
		bars[i].Records, bars[i].Denied = bars[i].Records*100/peak, bars[i].Denied*100/peak
	}
	pending := map[string]uint64{}
	for _, req := range c.s.approvals.Pending() {
		pending[req.Agent]++
	}
	stats := c.s.elog.Stats()
	var agents []agentHealth
	for _, a := range c.s.agents.list() {
		name := a.spec.Name
		st := stats[name]
		h := agentHealth{Name: name, Records: st.Records, Denied: st.Denied, Waiting: pending[name], Open: len(c.s.elog.OpenConns(name))}
		for reason, n := range st.DeniedByReason {
			switch {
			case strings.HasPrefix(reason, policy.ReasonQuotaPrefix), slices.Contains(countedReasons(), reason):
				h.Quota += n
			case strings.Contains(reason, "tunnel"):
				h.Tunnel += n
			}
		}
		agents = append(agents, h)
	}
	c.render(w, "health", sess, map[string]any{"Bars": bars, "Peak": peak, "Agents": agents})
}

func cmdUIToken(env *cliEnv, fs *flag.FlagSet, args []string) error {
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	var out struct{ Token string }
	if err := env.client().do("POST", "/v1/ui/token", nil, &out); err != nil {
		return err
	}
	fmt.Println(out.Token)
	return nil
}
