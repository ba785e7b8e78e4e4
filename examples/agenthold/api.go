//go:build linux

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agenthold/egress/dnsfilter"
	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/mitm"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/tproxy"
	"github.com/agenthold/egress/vault"
)

// AgentInfo is an agent as the admin API shows it.
type AgentInfo struct {
	Name     string     `json:"name"`
	Policy   PolicySpec `json:"policy"`
	NetNS    string     `json:"netns"`
	Sandbox4 string     `json:"sandbox_ipv4"`
	Sandbox6 string     `json:"sandbox_ipv6"`
	Gateway4 string     `json:"gateway_ipv4"`
	UID      uint32     `json:"uid"`
	GID      uint32     `json:"gid"`
	Secrets  []string   `json:"secrets,omitempty"`
	// Remote agents: where they reach the explicit proxy, and, in the
	// answer to their creation only, their token.
	Remote bool   `json:"remote,omitempty"`
	Proxy  string `json:"proxy,omitempty"`
	Token  string `json:"token,omitempty"`
}

// SecretPut is the body of PUT /v1/secrets/{name}.
type SecretPut struct {
	Preset string      `json:"preset,omitempty"`
	Rule   *vault.Rule `json:"rule,omitempty"`
	Owner  string      `json:"owner,omitempty"`
	Value  string      `json:"value"` // write-only: never returned
	// Source, instead of Value: where the gateway reads the value, a
	// file or a command (vault.Source). A command's first word that is
	// not a path is looked up in the gateway's PATH.
	Source *vault.Source `json:"source,omitempty"`
}

// AttachRequest is the body of POST /v1/agents/{name}/secrets.
type AttachRequest struct {
	Secret string `json:"secret"`
	Env    string `json:"env"`
}

// startAdmin serves the admin API on a unix socket of mode 0600, and
// /metrics on MetricsAddr if set.
func (s *server) startAdmin() error {
	path := s.cfg.adminSocket()
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	admin := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	s.servers.Go("admin API", func() error { return admin.Serve(ln) }, http.ErrServerClosed)
	s.servers.OnStop("admin API", func(ctx context.Context) error {
		err := admin.Shutdown(ctx)
		os.Remove(path) // only a server that served it removes it
		return err
	})
	if s.cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", s.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics_addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", s.serveMetrics)
		metrics := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.servers.Go("metrics", func() error { return metrics.Serve(mln) }, http.ErrServerClosed)
		s.servers.OnStop("metrics", metrics.Shutdown)
	}
	return nil
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, map[string]bool{"ok": true}) })
	mux.HandleFunc("GET /v1/agents", s.listAgents)
	mux.HandleFunc("POST /v1/agents", s.createAgent)
	mux.HandleFunc("DELETE /v1/agents/{name}", s.deleteAgent)
	mux.HandleFunc("GET /v1/agents/{name}/policy", s.getPolicy)
	mux.HandleFunc("PUT /v1/agents/{name}/policy", s.putPolicy)
	mux.HandleFunc("GET /v1/agents/{name}/exec", s.getExecInfo)
	mux.HandleFunc("POST /v1/agents/{name}/secrets", s.attachSecret)
	mux.HandleFunc("DELETE /v1/agents/{name}/secrets/{secret}", s.detachSecret)
	mux.HandleFunc("GET /v1/secrets", s.listSecrets)
	mux.HandleFunc("PUT /v1/secrets/{name}", s.putSecret)
	mux.HandleFunc("DELETE /v1/secrets/{name}", s.deleteSecret)
	mux.HandleFunc("POST /v1/master-key/rotate", s.rotateMasterKey)
	mux.HandleFunc("POST /v1/backup", s.serveBackup)
	mux.HandleFunc("GET /v1/presets", s.listPresets)
	mux.HandleFunc("GET /v1/log", s.readLog)
	mux.HandleFunc("GET /v1/approvals", s.listApprovals)
	mux.HandleFunc("POST /v1/approvals/{id}", s.answerApproval)
	mux.HandleFunc("POST /v1/ui/token", s.makeUIToken)
	mux.HandleFunc("GET /v1/audit/key", s.serveAuditKey)
	mux.HandleFunc("GET /v1/ca", s.serveCA)
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// decode reads a JSON body, refusing unknown fields.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad request body: %w", err)
	}
	return nil
}

func (s *server) info(a *agent) AgentInfo {
	var secrets []string
	for _, at := range s.vault.Attachments(a.spec.Name) {
		secrets = append(secrets, at.Secret+" as $"+at.Env)
	}
	spec := s.agents.specOf(a)
	if spec.Remote {
		info := AgentInfo{Name: spec.Name, Policy: spec.Policy, Secrets: secrets, Remote: true}
		switch {
		case s.cfg.Egress.RemoteListen != "" && s.cfg.Egress.RemoteTLS:
			info.Proxy = "https://" + s.cfg.Egress.RemoteListen
		case s.cfg.Egress.RemoteListen != "":
			info.Proxy = "http://" + s.cfg.Egress.RemoteListen
		}
		return info
	}
	return AgentInfo{Name: spec.Name, Policy: spec.Policy, NetNS: a.ns.Name, Sandbox4: a.sb4.String(), Sandbox6: a.sb6.String(), Gateway4: a.gw4.String(), UID: a.uid, GID: a.gid, Secrets: secrets}
}

func (s *server) listAgents(w http.ResponseWriter, _ *http.Request) {
	out := []AgentInfo{}
	for _, a := range s.agents.list() {
		out = append(out, s.info(a))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) createAgent(w http.ResponseWriter, r *http.Request) {
	var spec AgentSpec
	if err := decode(r, &spec); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	spec.Index = -1 // allocated by the server
	if spec.TokenHash != "" {
		writeError(w, http.StatusBadRequest, errors.New("token_hash is the server's to set"))
		return
	}
	var token string
	if spec.Remote {
		token = rand.Text() // 26 base32 characters: 130 bits
		sum := sha256.Sum256([]byte(token))
		spec.TokenHash = hex.EncodeToString(sum[:])
	}
	a, err := s.addAgent(r.Context(), spec)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errExists) {
			status = http.StatusConflict
		}
		writeError(w, status, err)
		return
	}
	info := s.info(a)
	info.Token = token // shown once: only its hash is kept
	writeJSON(w, http.StatusCreated, info)
}

func (s *server) deleteAgent(w http.ResponseWriter, r *http.Request) {
	if err := s.removeAgent(r.PathValue("name")); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, errNoAgent) {
			status = http.StatusNotFound
		}
		writeError(w, status, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pathAgent returns the agent the request's path names, or answers 404
// and returns nil.
func (s *server) pathAgent(w http.ResponseWriter, r *http.Request) *agent {
	a := s.agents.get(r.PathValue("name"))
	if a == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("no agent %q", r.PathValue("name")))
	}
	return a
}

func (s *server) getPolicy(w http.ResponseWriter, r *http.Request) {
	a := s.pathAgent(w, r)
	if a == nil {
		return
	}
	writeJSON(w, http.StatusOK, s.agents.specOf(a).Policy)
}

func (s *server) putPolicy(w http.ResponseWriter, r *http.Request) {
	var p PolicySpec
	if err := decode(r, &p); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if err := s.setPolicy(r.PathValue("name"), p); err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errNoAgent) {
			status = http.StatusNotFound
		}
		writeError(w, status, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) getExecInfo(w http.ResponseWriter, r *http.Request) {
	a := s.pathAgent(w, r)
	if a == nil {
		return
	}
	if s.agents.specOf(a).Remote {
		writeError(w, http.StatusBadRequest, fmt.Errorf("agent %s is remote: it runs elsewhere, not here", a.spec.Name))
		return
	}
	writeJSON(w, http.StatusOK, s.execInfo(a))
}

func (s *server) attachSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if s.agents.get(name) == nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("no agent %q", name))
		return
	}
	var req AttachRequest
	if err := decode(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	a, err := s.vault.Attach(name, req.Secret, req.Env)
	if err != nil {
		writeError(w, vaultStatus(err), err)
		return
	}
	s.log.Info("secret attached", "agent", a.Agent, "secret", a.Secret, "env", a.Env)
	writeJSON(w, http.StatusOK, map[string]string{"agent": a.Agent, "secret": a.Secret, "env": a.Env, "placeholder": a.Placeholder})
}

func (s *server) detachSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.vault.Detach(r.PathValue("name"), r.PathValue("secret")); err != nil {
		writeError(w, vaultStatus(err), err)
		return
	}
	s.log.Info("secret detached", "agent", r.PathValue("name"), "secret", r.PathValue("secret"))
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) listSecrets(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.vault.List())
}

func (s *server) putSecret(w http.ResponseWriter, r *http.Request) {
	var req SecretPut
	if err := decode(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	var rule vault.Rule
	switch {
	case req.Preset != "" && req.Rule != nil:
		writeError(w, http.StatusBadRequest, errors.New("give a preset or a rule, not both"))
		return
	case req.Preset != "":
		var ok bool
		if rule, ok = vault.Preset(req.Preset); !ok {
			writeError(w, http.StatusBadRequest, fmt.Errorf("no preset %q (have %s)", req.Preset, strings.Join(vault.PresetNames(), ", ")))
			return
		}
	case req.Rule != nil:
		rule = *req.Rule
	default:
		writeError(w, http.StatusBadRequest, errors.New("a secret needs a preset or a rule"))
		return
	}
	var err error
	if req.Source != nil {
		if req.Value != "" {
			writeError(w, http.StatusBadRequest, errors.New("give a value or a source, not both"))
			return
		}
		src := *req.Source
		if len(src.Command) > 0 && !strings.Contains(src.Command[0], "/") {
			if src.Command[0], err = exec.LookPath(src.Command[0]); err != nil {
				writeError(w, http.StatusBadRequest, fmt.Errorf("source command: %w", err))
				return
			}
		}
		err = s.vault.SetSource(vault.Secret{Name: r.PathValue("name"), Owner: req.Owner, Rule: rule, Source: &src})
	} else {
		value := []byte(req.Value)
		err = s.vault.Set(vault.Secret{Name: r.PathValue("name"), Owner: req.Owner, Rule: rule}, value)
		clear(value)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	s.log.Info("secret set", "secret", r.PathValue("name"), "owner", req.Owner) // never its value
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.vault.Delete(r.PathValue("name")); err != nil {
		writeError(w, vaultStatus(err), err)
		return
	}
	s.log.Info("secret deleted", "secret", r.PathValue("name"))
	w.WriteHeader(http.StatusNoContent)
}

// rotateMasterKey re-seals every secret under a new master key in its
// file (vault.RotateKeyFile); the old key opens nothing afterwards.
func (s *server) rotateMasterKey(w http.ResponseWriter, _ *http.Request) {
	if s.keyFromEnv {
		writeError(w, http.StatusConflict, fmt.Errorf("the master key comes from %s: rotate it where it is kept, then restart with the new one", masterKeyEnv))
		return
	}
	s.mu.Lock() // not in the middle of a backup
	defer s.mu.Unlock()
	if err := vault.RotateKeyFile(s.vault, s.cfg.masterKeyFile()); err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	s.log.Info("master key rotated", "file", s.cfg.masterKeyFile())
	w.WriteHeader(http.StatusNoContent)
}

// vaultStatus is the HTTP status of a vault error: 404 for what does not
// exist, 400 for the rest (a bad name, rule or value).
func vaultStatus(err error) int {
	if errors.Is(err, vault.ErrNotFound) {
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

func (s *server) listPresets(w http.ResponseWriter, _ *http.Request) {
	out := map[string]vault.Rule{}
	for _, n := range vault.PresetNames() {
		out[n], _ = vault.Preset(n)
	}
	writeJSON(w, http.StatusOK, out)
}

// readLog answers with JSON lines: the newest records that match, then,
// with follow=1, new ones as they come.
func (s *server) readLog(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := egresslog.Filter{Agent: q.Get("agent"), Kind: egresslog.Kind(q.Get("kind")), DeniedOnly: q.Get("denied") == "1"}
	if since := q.Get("since"); since != "" {
		if d, err := time.ParseDuration(since); err == nil {
			f.Since = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, since); err == nil {
			f.Since = t
		} else {
			writeError(w, http.StatusBadRequest, fmt.Errorf("since: %q is neither a duration nor an RFC 3339 time", since))
			return
		}
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	w.Header().Set("Content-Type", "application/x-ndjson")
	var follower *egresslog.Follower
	if q.Get("follow") == "1" {
		follower = s.elog.Follow(r.Context(), f, 0)
		defer follower.Close()
	}
	var buf []byte
	for _, rec := range s.elog.List(f, limit) {
		buf = append(rec.AppendJSON(buf[:0]), '\n')
		w.Write(buf)
	}
	if follower == nil {
		return
	}
	rc := http.NewResponseController(w)
	rc.Flush()
	for {
		select {
		case rec, ok := <-follower.C:
			if !ok {
				return
			}
			buf = append(rec.AppendJSON(buf[:0]), '\n')
			if _, err := w.Write(buf); err != nil {
				return
			}
			rc.Flush()
		case <-s.servers.Stopping(): // followers do not hold up a shutdown
			return
		}
	}
}

// makeUIToken makes the console's login token, shown in this answer only.
func (s *server) makeUIToken(w http.ResponseWriter, _ *http.Request) {
	token, err := s.newUIToken()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"token": token})
}

// serveCA serves the interception CA's certificate, or with ?bundle=1
// the bundle sandboxes trust (the system's roots, the extra upstream
// roots and the CA).
func (s *server) serveCA(w http.ResponseWriter, r *http.Request) {
	path := s.publicCAPath()
	if r.URL.Query().Get("bundle") == "1" {
		path = s.bundlePath()
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Write(pem)
}

// serveMetrics serves the counters in the Prometheus text format.
func (s *server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	stats := s.elog.Stats()
	agents := make([]string, 0, len(stats))
	for a := range stats {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	family := func(name, kind, help string) { fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind) }
	family("agenthold_egress_records_total", "counter", "DNS queries, connections and HTTP requests recorded.")
	for _, a := range agents {
		fmt.Fprintf(w, "agenthold_egress_records_total{agent=%s} %d\n", label(a), stats[a].Records)
	}
	family("agenthold_egress_denied_total", "counter", "Denied DNS queries, connections and requests, by reason.")
	for _, a := range agents {
		reasons := make([]string, 0, len(stats[a].DeniedByReason))
		for r := range stats[a].DeniedByReason {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			fmt.Fprintf(w, "agenthold_egress_denied_total{agent=%s,reason=%s} %d\n", label(a), label(r), stats[a].DeniedByReason[r])
		}
	}
	family("agenthold_egress_quota_exceeded_total", "counter", "Requests refused because the agent exceeded a quota or a bound of the gateway, by which.")
	for _, a := range agents {
		for _, r := range countedReasons() {
			if n := stats[a].DeniedByReason[r]; n > 0 {
				fmt.Fprintf(w, "agenthold_egress_quota_exceeded_total{agent=%s,quota=%s} %d\n", label(a), label(strings.TrimPrefix(r, policy.ReasonQuotaPrefix)), n)
			}
		}
	}
	family("agenthold_approvals_pending", "gauge", "Approval requests waiting for an answer, by agent.")
	pending := map[string]int{}
	for _, req := range s.approvals.Pending() {
		pending[req.Agent]++
	}
	for _, a := range slices.Sorted(maps.Keys(pending)) {
		fmt.Fprintf(w, "agenthold_approvals_pending{agent=%s} %d\n", label(a), pending[a])
	}
	family("agenthold_egress_injected_total", "counter", "Requests that carried an injected secret.")
	for _, a := range agents {
		fmt.Fprintf(w, "agenthold_egress_injected_total{agent=%s} %d\n", label(a), stats[a].Injected)
	}
	family("agenthold_egress_bytes_total", "counter", "Bytes moved for agents, by direction.")
	for _, a := range agents {
		fmt.Fprintf(w, "agenthold_egress_bytes_total{agent=%s,direction=\"up\"} %d\n", label(a), stats[a].BytesUp)
		fmt.Fprintf(w, "agenthold_egress_bytes_total{agent=%s,direction=\"down\"} %d\n", label(a), stats[a].BytesDown)
	}
	family("agenthold_agents", "gauge", "Agents with a network.")
	fmt.Fprintf(w, "agenthold_agents %d\n", len(s.agents.list()))
	dropped, failed := s.elog.SinkStats()
	family("agenthold_egress_log_sink_dropped_total", "counter", "Records the log sinks missed.")
	fmt.Fprintf(w, "agenthold_egress_log_sink_dropped_total %d\n", dropped+failed)
	// What is dropped without a record of its own, so that a flood of it
	// cannot fill the log.
	family("agenthold_dns_dropped_total", "counter", "DNS packets and replies dropped without a record, by why.")
	c := s.dns.Counters()
	fmt.Fprintf(w, "agenthold_dns_dropped_total{why=\"unknown source\"} %d\n", c.UnknownSources)
	fmt.Fprintf(w, "agenthold_dns_dropped_total{why=\"malformed\"} %d\n", c.Malformed)
	fmt.Fprintf(w, "agenthold_dns_dropped_total{why=\"reply would block\"} %d\n", c.RepliesDropped)
	if s.rules != nil {
		if n, err := s.rules.Spoofed(); err == nil {
			family("agenthold_spoofed_packets_total", "counter", "Packets dropped on an agent's link for a source address that is not the agent's.")
			fmt.Fprintf(w, "agenthold_spoofed_packets_total %d\n", n)
		}
	}
}

// countedReasons are the denials an agent causes by exceeding its quotas
// or the gateway's bounds: always counted, however many other reasons
// the agent provokes, and exported as their own family.
func countedReasons() []string {
	return slices.Concat(policy.QuotaReasons(), policy.BoundReasons(), tproxy.BoundReasons(), dnsfilter.BoundReasons(),
		mitm.BoundReasons(), vault.BoundReasons())
}

// label quotes a Prometheus label value.
func label(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v) + `"`
}
