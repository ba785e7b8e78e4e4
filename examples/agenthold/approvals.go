//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agenthold/egress/policy/approval"
)

// openApprovals makes the broker that holds what agents in ask mode
// reach for and no entry allows: answered through the admin API (the
// approvals, approve and deny commands) or the configured webhook. An
// "always" answer, or a deny that asks for one, adds the entry to the
// agent's policy, persisted as a policy set would.
func (s *server) openApprovals() error {
	cfg := s.cfg.Egress.Approvals
	s.approvals = &approval.Broker{
		Timeout: cfg.Timeout, MaxPendingPerAgent: cfg.MaxPendingPerAgent, SessionLength: cfg.SessionLength,
		OnAlways: s.addEntry, OnDenyEntry: s.addEntry, Log: s.elog, Logger: s.log,
	}
	if cfg.WebhookURL != "" {
		// Readable by its owner only, as the master key: a sandbox sees
		// the host's files, and exec's cover over this one lapses when
		// the file is replaced (a Secret volume's update).
		fi, err := os.Stat(cfg.WebhookSecretFile)
		if err == nil && fi.Mode().Perm()&0o077 != 0 {
			return fmt.Errorf("egress.approvals.webhook_secret_file: %s has mode %v; it must be readable by its owner only (chmod 600, or a Secret volume's defaultMode 0400)", cfg.WebhookSecretFile, fi.Mode().Perm())
		}
		secret, err := os.ReadFile(cfg.WebhookSecretFile)
		if err != nil {
			return fmt.Errorf("egress.approvals.webhook_secret_file: %w", err)
		}
		if secret = []byte(strings.TrimSpace(string(secret))); len(secret) < 16 {
			return errors.New("egress.approvals.webhook_secret_file: the secret is shorter than 16 bytes")
		}
		s.approvals.Webhook = &approval.Webhook{URL: cfg.WebhookURL, Secret: secret}
	}
	return nil
}

// addEntry adds an entry to an agent's policy, as policy set would.
func (s *server) addEntry(agent, entry string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.agents.get(agent)
	if a == nil {
		return errNoAgent
	}
	spec := s.agents.specOf(a).Policy
	if slices.Contains(spec.Allow, entry) {
		return nil
	}
	spec.Allow = append(slices.Clone(spec.Allow), entry)
	return s.setPolicy(agent, spec)
}

// listApprovals answers with the pending approval requests as JSON
// lines, then, with follow=1, new ones as they are raised.
func (s *server) listApprovals(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	var follow <-chan approval.Request
	if r.URL.Query().Get("follow") == "1" {
		follow = s.approvals.Follow(r.Context())
	}
	enc := json.NewEncoder(w)
	for _, req := range s.approvals.Pending() {
		enc.Encode(req)
	}
	if follow == nil {
		return
	}
	rc := http.NewResponseController(w)
	rc.Flush()
	for {
		select {
		case req, ok := <-follow:
			if !ok || enc.Encode(req) != nil {
				return
			}
			rc.Flush()
		case <-s.servers.Stopping():
			return
		}
	}
}

// approvalAnswer is the body of POST /v1/approvals/{id}.
type approvalAnswer struct {
	Answer    approval.Answer `json:"answer"`
	DenyEntry bool            `json:"deny_entry,omitempty"` // with deny: add a deny entry too
	By        string          `json:"by,omitempty"`         // who answers, for the record
}

func (s *server) answerApproval(w http.ResponseWriter, r *http.Request) {
	var a approvalAnswer
	if err := decode(r, &a); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	by := "admin API"
	if a.By != "" {
		by = a.By + " (admin API)"
	}
	switch err := s.answer(r.PathValue("id"), a.Answer, by, a.DenyEntry); {
	case errors.Is(err, approval.ErrNotPending):
		writeError(w, http.StatusNotFound, err)
	case err != nil:
		writeError(w, http.StatusBadRequest, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// answer answers a pending request, and says so in the server's log: the
// admin API and the console answer through it.
func (s *server) answer(id string, a approval.Answer, by string, denyEntry bool) error {
	err := s.approvals.Answer(id, a, by, denyEntry)
	if err == nil {
		s.log.Info("approval answered", "id", id, "answer", a, "by", by, "deny_entry", denyEntry)
	}
	return err
}

func cmdApprovals(env *cliEnv, fs *flag.FlagSet, args []string) error {
	follow := fs.Bool("follow", false, "keep printing new requests as they are raised")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	path := "/v1/approvals"
	if *follow {
		path += "?follow=1"
	}
	resp, err := env.client().get(path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAGENT\tDESTINATION\tRAISED BY\tWAITING\tEXPIRES IN")
	tw.Flush()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var req approval.Request
		if json.Unmarshal(sc.Bytes(), &req) != nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", req.ID, req.Agent, req.Entry, req.Kind, req.Waiting, time.Until(req.Expires).Round(time.Second))
		tw.Flush()
	}
	return sc.Err()
}

func cmdApprove(env *cliEnv, fs *flag.FlagSet, args []string) error {
	once := fs.Bool("once", false, "the requests waiting, and the connection that follows an approved lookup (the default)")
	session := fs.Bool("session", false, "until the agent is deleted or the gateway restarts")
	always := fs.Bool("always", false, "add an allow entry to the agent's policy")
	by := fs.String("by", os.Getenv("USER"), "who answers, for the record")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	answer := approval.Once
	switch {
	case (*once && *session) || (*once && *always) || (*session && *always):
		return usagef("approve: one of --once, --session and --always")
	case *session:
		answer = approval.Session
	case *always:
		answer = approval.Always
	}
	if err := env.client().do("POST", "/v1/approvals/"+pos[0], approvalAnswer{Answer: answer, By: *by}, nil); err != nil {
		return err
	}
	fmt.Printf("approval %s: %s\n", pos[0], answer)
	return nil
}

func cmdDeny(env *cliEnv, fs *flag.FlagSet, args []string) error {
	entry := fs.Bool("entry", false, "also add a deny entry to the agent's policy")
	by := fs.String("by", os.Getenv("USER"), "who answers, for the record")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	if err := env.client().do("POST", "/v1/approvals/"+pos[0], approvalAnswer{Answer: approval.Deny, DenyEntry: *entry, By: *by}, nil); err != nil {
		return err
	}
	fmt.Printf("approval %s: denied\n", pos[0])
	return nil
}
