// Package approval holds the queries and connections that a policy in ask
// mode would refuse for want of an entry, while a person or a policy
// service decides: a Broker is the policy.Approver the blocks ask.
//
// Requests are keyed by agent, name and port (a DNS lookup and ports 80
// and 443 are one key: the name on the web), and those that come while
// one is pending wait on it: a hundred connections raise one approval
// request. Each agent has a bound on the approval requests it has
// pending and on the queries and connections waiting, beyond which it is
// refused at once, so an agent cannot flood the person who answers nor
// hold the gateway's handlers. A request not answered in Timeout is
// refused with its reason.
//
// An answer is Once (the requests waiting, and, for a request raised by
// a DNS lookup, the connection that follows it within OnceWindow),
// Session (until the agent is forgotten, or SessionLength), Always (an
// allow entry, which OnAlways persists in the agent's policy) or Deny
// (the requests waiting are refused; OnDenyEntry may add a deny entry).
// Answers come from Answer (an admin API, a CLI) or a Webhook, whose
// exchange is signed both ways. Every request and answer is a record.
//
// The broker does not judge: it is asked only about what a policy marked
// askable (policy.Decision.Askable), which never includes a deny entry's
// destination, a DNS side door or an address; and whatever it approves,
// the dial still refuses the private and never tiers.
package approval

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// Defaults for a Broker's zero fields.
const (
	DefaultTimeout            = 60 * time.Second
	DefaultMaxPendingPerAgent = 8
	DefaultMaxWaitingPerAgent = 64
	DefaultOnceWindow         = 10 * time.Second
	// DefaultDenyCooldown is how long a refused destination is refused
	// again at once rather than asked about anew.
	DefaultDenyCooldown = 30 * time.Second
	// DefaultAskRate is the approval requests an agent may raise per
	// second, in bursts of its MaxPendingPerAgent.
	DefaultAskRate = 1.0
)

// Answer is how an approval request is answered.
type Answer string

// The answers.
const (
	Once    Answer = "once"
	Session Answer = "session"
	Always  Answer = "always"
	Deny    Answer = "deny"
)

// ParseAnswer parses an answer's name.
func ParseAnswer(s string) (Answer, error) {
	switch a := Answer(s); a {
	case Once, Session, Always, Deny:
		return a, nil
	}
	return "", fmt.Errorf("approval: %q is not an answer (once, session, always or deny)", s)
}

// Errors of Answer.
var (
	ErrNotPending = errors.New("approval: no such request pending (answered, timed out, or never raised)")
	ErrNoPersist  = errors.New("approval: this gateway cannot add entries to a policy (no OnAlways)")
)

// Request is an approval request: what waits, and since when.
type Request struct {
	ID      string    `json:"id"`
	Agent   string    `json:"agent"`
	Name    string    `json:"name"`
	Port    uint16    `json:"port,omitempty"` // 0: the name on the web (DNS, 80, 443)
	Kind    string    `json:"kind"`           // what raised it: dns, tls, http, connect
	Asked   time.Time `json:"asked"`
	Expires time.Time `json:"expires"`
	Waiting int       `json:"waiting"` // queries and connections waiting on it
	// Entry is the allow entry an Always answer adds.
	Entry string `json:"entry"`
}

// Broker holds what waits for approval. Set its fields before use; it is
// safe for concurrent use.
type Broker struct {
	Timeout            time.Duration // zero means DefaultTimeout
	MaxPendingPerAgent int           // zero means DefaultMaxPendingPerAgent
	MaxWaitingPerAgent int           // zero means DefaultMaxWaitingPerAgent
	OnceWindow         time.Duration // zero means DefaultOnceWindow
	DenyCooldown       time.Duration // zero means DefaultDenyCooldown
	AskRate            float64       // zero means DefaultAskRate
	// SessionLength bounds a Session answer; zero means until the agent
	// is forgotten.
	SessionLength time.Duration
	// OnAlways adds entry to agent's policy, persisted: an Always answer
	// fails (and the request stays pending) if it fails or is nil.
	OnAlways func(agent, entry string) error
	// OnDenyEntry adds a deny entry ("!"+entry) when a Deny answer asks
	// for one; nil refuses such answers.
	OnDenyEntry func(agent, entry string) error
	Webhook     *Webhook       // optional: asked about each new request
	Log         *egresslog.Log // optional: a record per request and answer
	Logger      *slog.Logger   // nil means slog.Default()

	mu        sync.Mutex
	pending   map[key]*pending
	byID      map[string]*pending
	grants    map[string]map[key]grant // agent -> grants
	perAgent  map[string]int           // pending requests
	waiting   map[string]int           // queries and connections waiting
	followers map[chan Request]struct{}
	asked     map[string]*bucket // per agent: the rate of new requests
	closed    bool
}

// bucket is a token bucket of approval requests.
type bucket struct {
	tokens float64
	last   time.Time
}

// take takes a token at now, filling at rate up to burst.
func (k *bucket) take(now time.Time, rate float64, burst int) bool {
	k.tokens = min(float64(burst), k.tokens+now.Sub(k.last).Seconds()*rate)
	k.last = now
	if k.tokens < 1 {
		return false
	}
	k.tokens--
	return true
}

type key struct {
	agent, name string
	port        uint16
}

// keyOf groups a DNS lookup with ports 80 and 443: the name on the web.
func keyOf(agent, name string, port uint16) key {
	if port == 80 || port == 443 {
		port = 0
	}
	return key{agent, name, port}
}

func (k key) entry() string {
	if k.port == 0 {
		return k.name
	}
	return k.name + ":" + strconv.Itoa(int(k.port))
}

type grant struct {
	id    string
	how   Answer // Deny: refused at once until the cooldown ends
	by    string
	until time.Time // zero: no end
	once  bool      // consumed by the next connection
}

type pending struct {
	req     Request
	dnsOnly bool // every query and connection so far was a DNS lookup
	timer   *time.Timer
	done    chan struct{}
	// claimed is set while an answer that must persist an entry first is
	// doing so: nothing else may end the request meanwhile; expired says
	// that the timeout came in that time.
	claimed, expired bool
	// Set before done is closed.
	answer Answer
	by     string
	why    string // a refusal's reason
}

func (b *Broker) init() {
	if b.pending == nil {
		b.pending = map[key]*pending{}
		b.byID = map[string]*pending{}
		b.grants = map[string]map[key]grant{}
		b.perAgent = map[string]int{}
		b.waiting = map[string]int{}
		b.followers = map[chan Request]struct{}{}
		b.asked = map[string]*bucket{}
	}
}

func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

func (b *Broker) logger() *slog.Logger {
	if b.Logger != nil {
		return b.Logger
	}
	return slog.Default()
}

// Approve implements policy.Approver: it holds the query or connection
// until its request is answered, times out, or ctx is done.
func (b *Broker) Approve(ctx context.Context, q policy.ApprovalQuery) policy.Decision {
	k := keyOf(q.Agent, q.Name, q.Port)
	now := time.Now()
	b.mu.Lock()
	b.init()
	if b.closed {
		b.mu.Unlock()
		return refused(q, "", policy.ReasonApprovalGone)
	}
	if d, ok := b.granted(k, q, now); ok {
		b.mu.Unlock()
		return d
	}
	if b.waiting[q.Agent] >= orDefault(b.MaxWaitingPerAgent, DefaultMaxWaitingPerAgent) {
		b.mu.Unlock()
		return refused(q, "", policy.ReasonApprovalBusy)
	}
	p := b.pending[k]
	if p == nil {
		burst := orDefault(b.MaxPendingPerAgent, DefaultMaxPendingPerAgent)
		rate := b.AskRate
		if rate <= 0 {
			rate = DefaultAskRate
		}
		k2 := b.asked[q.Agent]
		if k2 == nil {
			k2 = &bucket{tokens: float64(burst), last: now}
			b.asked[q.Agent] = k2
		}
		if b.perAgent[q.Agent] >= burst || !k2.take(now, rate, burst) {
			b.mu.Unlock()
			return refused(q, "", policy.ReasonApprovalBusy)
		}
		p = b.raise(k, q, now)
	}
	if q.Kind != "dns" {
		p.dnsOnly = false
	}
	p.req.Waiting++
	b.waiting[q.Agent]++
	b.mu.Unlock()

	var gone bool
	select {
	case <-p.done:
	case <-ctx.Done():
		gone = true
	}

	b.mu.Lock()
	p.req.Waiting--
	b.waiting[q.Agent]--
	if b.waiting[q.Agent] == 0 {
		delete(b.waiting, q.Agent)
	}
	b.mu.Unlock()
	if gone {
		return refused(q, p.req.ID, policy.ReasonApprovalGone)
	}
	if p.answer == Deny || p.answer == "" {
		return refused(q, p.req.ID, p.why)
	}
	return approved(q, p.req.ID, p.answer, p.by)
}

// granted finds a grant for k: a session's, an always answer's until the
// policy holds it, or a once answer's left for the connection after a
// lookup. Called with b.mu held.
func (b *Broker) granted(k key, q policy.ApprovalQuery, now time.Time) (policy.Decision, bool) {
	g, ok := b.grants[k.agent][k]
	if !ok {
		return policy.Decision{}, false
	}
	if !g.until.IsZero() && now.After(g.until) {
		delete(b.grants[k.agent], k)
		return policy.Decision{}, false
	}
	if g.how == Deny {
		return refused(q, g.id, policy.ReasonApprovalDenied+" (recently)"), true
	}
	if g.once {
		if q.Kind == "dns" {
			return policy.Decision{}, false // a once answer carries to one connection, not to more lookups
		}
		delete(b.grants[k.agent], k)
	}
	return approved(q, g.id, g.how, g.by), true
}

// raise creates the approval request for k. Called with b.mu held.
func (b *Broker) raise(k key, q policy.ApprovalQuery, now time.Time) *pending {
	timeout := orDefault(b.Timeout, DefaultTimeout)
	p := &pending{
		req:     Request{ID: newID(), Agent: k.agent, Name: k.name, Port: k.port, Kind: q.Kind, Asked: now, Expires: now.Add(timeout), Entry: k.entry()},
		dnsOnly: true,
		done:    make(chan struct{}),
	}
	b.pending[k] = p
	b.byID[p.req.ID] = p
	b.perAgent[k.agent]++
	p.timer = time.AfterFunc(timeout, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if p.claimed {
			p.expired = true // the answer being persisted decides
			return
		}
		b.resolveLocked(p, "", "timeout", policy.ReasonApprovalTimeout)
	})
	b.record(p.req, false, "approval requested")
	for f := range b.followers {
		select {
		case f <- p.req:
		default: // a follower that falls behind misses requests; Pending lists them
		}
	}
	if b.Webhook != nil {
		go b.ask(p.req, p.done)
	}
	return p
}

// ask posts a request to the webhook and takes its answer, if it gave one.
func (b *Broker) ask(req Request, done <-chan struct{}) {
	ctx, cancel := context.WithDeadline(context.Background(), req.Expires)
	defer cancel()
	go func() { // the POST ends when the request does
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	a, err := b.Webhook.post(ctx, req)
	switch {
	case errors.Is(err, context.Canceled):
		// answered meanwhile, or the gateway is stopping
	case err != nil:
		b.logger().Warn("approval webhook", "id", req.ID, "agent", req.Agent, "name", req.Name, "err", err)
	case a != "":
		if err := b.Answer(req.ID, a, "webhook", false); err != nil && !errors.Is(err, ErrNotPending) {
			b.logger().Warn("approval webhook answer", "id", req.ID, "answer", a, "err", err)
		}
	}
}

// Answer answers the pending request id, as by says (a person's name,
// "admin API", "webhook"). With Deny, denyEntry adds a deny entry for the
// destination; with Always, the allow entry is added first, and the
// request stays pending if that fails. While an entry is being added,
// nothing else ends the request: the entry and the answer go together.
func (b *Broker) Answer(id string, a Answer, by string, denyEntry bool) error {
	if _, err := ParseAnswer(string(a)); err != nil {
		return err
	}
	var hook func(agent, entry string) error
	switch {
	case a == Always:
		hook = b.OnAlways
	case a == Deny && denyEntry:
		hook = b.OnDenyEntry
	}
	if (a == Always || a == Deny && denyEntry) && hook == nil {
		return ErrNoPersist
	}
	b.mu.Lock()
	b.init()
	p := b.byID[id]
	if p == nil || p.claimed {
		b.mu.Unlock()
		return ErrNotPending
	}
	if hook == nil {
		defer b.mu.Unlock()
		b.resolveLocked(p, a, by, policy.ReasonApprovalDenied)
		return nil
	}
	p.claimed = true
	b.mu.Unlock()
	entry := p.req.Entry
	if a == Deny {
		entry = "!" + entry
	}
	err := hook(p.req.Agent, entry)
	b.mu.Lock()
	defer b.mu.Unlock()
	p.claimed = false
	switch {
	case err != nil && p.expired:
		b.resolveLocked(p, "", "timeout", policy.ReasonApprovalTimeout)
	case err != nil:
	default:
		b.resolveLocked(p, a, by, policy.ReasonApprovalDenied)
	}
	if err != nil {
		return fmt.Errorf("approval: add %q to %s's policy: %w", entry, p.req.Agent, err)
	}
	return nil
}

// resolveLocked ends p with answer a ("" for a refusal without one),
// granting what a grants. It reports false if p was already over.
// Called with b.mu held.
func (b *Broker) resolveLocked(p *pending, a Answer, by, why string) bool {
	k := keyOf(p.req.Agent, p.req.Name, p.req.Port)
	if b.byID[p.req.ID] != p || p.claimed {
		return false
	}
	delete(b.byID, p.req.ID)
	delete(b.pending, k)
	if b.perAgent[k.agent]--; b.perAgent[k.agent] <= 0 {
		delete(b.perAgent, k.agent)
	}
	p.timer.Stop()
	p.answer, p.by, p.why = a, by, why
	g := grant{id: p.req.ID, how: a, by: by}
	switch a {
	case Once:
		g.once, g.until = true, time.Now().Add(orDefault(b.OnceWindow, DefaultOnceWindow))
		if !p.dnsOnly {
			break // the connections waiting were the once
		}
		b.grant(k, g)
	case Session:
		if b.SessionLength > 0 {
			g.until = time.Now().Add(b.SessionLength)
		}
		b.grant(k, g)
	case Always:
		// The policy holds the entry from now on; the grant is a once's,
		// for the connection after an approved lookup, in case the
		// agent's new policy is not yet in place.
		if p.dnsOnly {
			g.once, g.until = true, time.Now().Add(orDefault(b.OnceWindow, DefaultOnceWindow))
			b.grant(k, g)
		}
	case Deny, "":
		// Asked again at once, the same destination would flood the
		// person answering: refused at once for a while.
		g.how, g.until = Deny, time.Now().Add(orDefault(b.DenyCooldown, DefaultDenyCooldown))
		b.grant(k, g)
	}
	close(p.done)
	if a == "" || a == Deny {
		b.record(p.req, false, refusalReason(why, a, by))
	} else {
		b.record(p.req, true, fmt.Sprintf("approved %s by %s", a, by))
	}
	return true
}

// grant stores g for k. Each time the agent's grants reach another
// multiple of grantSweep, those expired are dropped first: every refused
// request leaves a Deny cooldown, and an agent that asks about a new name
// each time would otherwise make the broker keep all it ever asked,
// where what it holds should be what is still in force.
func (b *Broker) grant(k key, g grant) {
	gs := b.grants[k.agent]
	if gs == nil {
		gs = map[key]grant{}
		b.grants[k.agent] = gs
	}
	if len(gs) > 0 && len(gs)%grantSweep == 0 {
		now := time.Now()
		maps.DeleteFunc(gs, func(_ key, g grant) bool { return !g.until.IsZero() && now.After(g.until) })
	}
	gs[k] = g
}

// grantSweep is how many grants of an agent's are added between two
// sweeps of those expired.
const grantSweep = 64

func refusalReason(why string, a Answer, by string) string {
	if a == Deny {
		return policy.ReasonApprovalDenied + " by " + by
	}
	return why
}

// Pending lists the requests waiting for an answer, oldest first.
func (b *Broker) Pending() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Request, 0, len(b.byID))
	for _, p := range b.byID {
		out = append(out, p.req)
	}
	sortRequests(out)
	return out
}

// Follow returns the requests raised from now on, until ctx is done. A
// follower that does not keep up misses requests (Pending lists them).
func (b *Broker) Follow(ctx context.Context) <-chan Request {
	ch := make(chan Request, 64)
	b.mu.Lock()
	b.init()
	b.followers[ch] = struct{}{}
	b.mu.Unlock()
	context.AfterFunc(ctx, func() {
		b.mu.Lock()
		delete(b.followers, ch)
		close(ch)
		b.mu.Unlock()
	})
	return ch
}

// Forget drops an agent's grants and refuses its pending requests: the
// agent is gone.
func (b *Broker) Forget(agent string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	for _, p := range b.byID {
		if p.req.Agent == agent {
			b.resolveLocked(p, "", "gateway", policy.ReasonApprovalGone)
		}
	}
	delete(b.grants, agent)
	delete(b.asked, agent)
}

// Revoke drops an agent's grants (sessions, a once left for a
// connection, refusals in their cooldown): its policy changed, and what
// was answered under the old one is asked about again.
func (b *Broker) Revoke(agent string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	delete(b.grants, agent)
}

// Close refuses every pending request, and every one after: the gateway
// is stopping.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	b.closed = true
	for _, p := range b.byID {
		b.resolveLocked(p, "", "gateway", policy.ReasonApprovalGone)
	}
	return nil
}

// record writes a request's record: raised, or answered. Its rule names
// the request and the entry an Always answer adds.
func (b *Broker) record(r Request, allowed bool, reason string) {
	if b.Log == nil {
		return
	}
	b.Log.Record(egresslog.Record{
		Agent: r.Agent, Kind: egresslog.KindApproval, Host: r.Name, Port: r.Port, Method: r.Kind,
		Allowed: allowed, Reason: reason, Rule: "approval " + r.ID + " " + r.Entry,
	})
}

func sortRequests(rs []Request) {
	slices.SortFunc(rs, func(a, b Request) int { return a.Asked.Compare(b.Asked) })
}

func approved(q policy.ApprovalQuery, id string, how Answer, by string) policy.Decision {
	return policy.Decision{Allowed: true, Approved: true, Name: q.Name, Rule: "approval " + id, Reason: fmt.Sprintf("approved %s by %s", how, by)}
}

func refused(q policy.ApprovalQuery, id, why string) policy.Decision {
	d := q.Refusal
	d.Askable = false
	d.Reason = why
	if id != "" {
		d.Rule = "approval " + id
	}
	return d
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
