package approval

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// askPolicy is an allowlist in ask mode with one allow and one deny entry.
func askPolicy(t testing.TB) *policy.Policy {
	p, err := policy.New(policy.Config{Ask: true, Allow: []string{"github.com", "!pastebin.com"}})
	require.NoError(t, err)
	return p
}

// ask runs policy.Ask for agent on name:port in the background.
func ask(b *Broker, p *policy.Policy, agent, name string, port uint16, kind string) <-chan policy.Decision {
	out := make(chan policy.Decision, 1)
	go func() {
		d := p.Decide(name, port)
		if port == 0 {
			d = p.DecideName(name)
		}
		out <- policy.Ask(context.Background(), b, agent, d, port, kind, func() *policy.Policy { return p })
	}()
	return out
}

// pendingFor waits until a request for name is pending with n waiting.
func pendingFor(t *testing.T, b *Broker, name string, n int) Request {
	t.Helper()
	var got Request
	require.Eventually(t, func() bool {
		for _, r := range b.Pending() {
			if r.Name == name && r.Waiting == n {
				got = r
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond, "no request for %s with %d waiting", name, n)
	return got
}

func wait(t *testing.T, ch <-chan policy.Decision) policy.Decision {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("still held")
		return policy.Decision{}
	}
}

func TestAskableOnlyWhatNoEntryDecides(t *testing.T) {
	p := askPolicy(t)
	assert.True(t, p.DecideName("docs.example").Askable, "a name no entry allows")
	assert.True(t, p.Decide("github.com", 22).Askable, "a port no entry allows")
	assert.False(t, p.Decide("pastebin.com", 443).Askable, "a deny entry's")
	assert.False(t, p.Decide("dns.google", 443).Askable, "a DNS-over-HTTPS resolver")
	assert.False(t, p.Decide("dot.example", 853).Askable, "DNS over TLS")
	assert.False(t, p.Decide("169.254.169.254", 80).Askable, "an address (the metadata service's)")
	assert.False(t, p.Decide("github.com", 443).Askable, "allowed")
	notAsk, err := policy.New(policy.Config{Allow: []string{"github.com"}})
	require.NoError(t, err)
	assert.False(t, notAsk.DecideName("docs.example").Askable, "not in ask mode")
}

// TestOnceThenHeldAgain: a lookup held, approved once while it waits;
// the connection that follows goes through on that answer; the next
// lookup is held again.
func TestOnceThenHeldAgain(t *testing.T) {
	log := &egresslog.Log{}
	b := &Broker{Log: log}
	p := askPolicy(t)
	a, aaaa := ask(b, p, "a1", "docs.example", 0, "dns"), ask(b, p, "a1", "docs.example", 0, "dns")
	req := pendingFor(t, b, "docs.example", 2)
	assert.Equal(t, "docs.example", req.Entry)
	require.NoError(t, b.Answer(req.ID, Once, "alice", false))
	for _, ch := range []<-chan policy.Decision{a, aaaa} {
		d := wait(t, ch)
		assert.True(t, d.Allowed)
		assert.Equal(t, "approved once by alice", d.Reason)
	}
	d := wait(t, ask(b, p, "a1", "docs.example", 443, "tls"))
	assert.True(t, d.Allowed, "the connection after the approved lookup")
	again := ask(b, p, "a1", "docs.example", 443, "tls")
	req2 := pendingFor(t, b, "docs.example", 1)
	assert.NotEqual(t, req.ID, req2.ID, "held again: a new request")
	require.NoError(t, b.Answer(req2.ID, Deny, "alice", false))
	d = wait(t, again)
	assert.False(t, d.Allowed)
	assert.Equal(t, policy.ReasonApprovalDenied, d.Reason)

	var reasons []string
	for _, r := range log.List(egresslog.Filter{}, 0) {
		if r.Kind == egresslog.KindApproval {
			reasons = append(reasons, r.Reason)
		}
	}
	assert.ElementsMatch(t, []string{"approval requested", "approved once by alice", "approval requested", "refused by approval by alice"}, reasons)
}

func TestSessionAndForget(t *testing.T) {
	b := &Broker{}
	p := askPolicy(t)
	ch := ask(b, p, "a1", "api.example", 8443, "tls")
	require.NoError(t, b.Answer(pendingFor(t, b, "api.example", 1).ID, Session, "bob", false))
	assert.True(t, wait(t, ch).Allowed)
	for range 3 {
		assert.True(t, wait(t, ask(b, p, "a1", "api.example", 8443, "tls")).Allowed, "the session's answer holds")
	}
	ask(b, p, "a2", "api.example", 8443, "tls")
	pendingFor(t, b, "api.example", 1) // another agent is asked for itself
	b.Forget("a1")
	ask(b, p, "a1", "api.example", 8443, "tls")
	require.Eventually(t, func() bool { return len(b.Pending()) == 2 }, 5*time.Second, time.Millisecond,
		"a forgotten agent's session is over: it is asked again")
}

func TestAlwaysAndDenyEntryPersist(t *testing.T) {
	var added []string
	fail := atomic.Bool{}
	b := &Broker{
		OnAlways: func(agent, entry string) error {
			if fail.Load() {
				return fmt.Errorf("disk full")
			}
			added = append(added, agent+" "+entry)
			return nil
		},
		OnDenyEntry: func(agent, entry string) error { added = append(added, agent+" "+entry); return nil },
	}
	p := askPolicy(t)
	ch := ask(b, p, "a1", "github.com", 22, "tcp")
	req := pendingFor(t, b, "github.com", 1)
	fail.Store(true)
	assert.Error(t, b.Answer(req.ID, Always, "alice", false), "an entry that could not be added")
	assert.Len(t, b.Pending(), 1, "and the request still pending")
	fail.Store(false)
	require.NoError(t, b.Answer(req.ID, Always, "alice", false))
	assert.True(t, wait(t, ch).Allowed)
	ch = ask(b, p, "a1", "exfil.example", 443, "tls")
	require.NoError(t, b.Answer(pendingFor(t, b, "exfil.example", 1).ID, Deny, "alice", true))
	assert.False(t, wait(t, ch).Allowed)
	assert.Equal(t, []string{"a1 github.com:22", "a1 !exfil.example"}, added)
	assert.ErrorIs(t, b.Answer(req.ID, Once, "alice", false), ErrNotPending, "answered twice")
}

func TestTimeoutRefuses(t *testing.T) {
	b := &Broker{Timeout: 50 * time.Millisecond}
	d := wait(t, ask(b, askPolicy(t), "a1", "slow.example", 443, "tls"))
	assert.False(t, d.Allowed)
	assert.Equal(t, policy.ReasonApprovalTimeout, d.Reason)
	assert.Contains(t, d.Rule, "approval ")
	assert.Empty(t, b.Pending())
}

// TestHundredWaitOnOne: concurrent requests for one destination raise
// one approval request, and one answer releases them all.
func TestHundredWaitOnOne(t *testing.T) {
	log := &egresslog.Log{}
	b := &Broker{Log: log, MaxWaitingPerAgent: 200}
	p := askPolicy(t)
	var chans []<-chan policy.Decision
	for range 100 {
		chans = append(chans, ask(b, p, "a1", "new.example", 443, "tls"))
	}
	req := pendingFor(t, b, "new.example", 100)
	assert.Len(t, b.Pending(), 1)
	require.NoError(t, b.Answer(req.ID, Once, "alice", false))
	for _, ch := range chans {
		assert.True(t, wait(t, ch).Allowed)
	}
	raised := 0
	for _, r := range log.List(egresslog.Filter{}, 0) {
		if r.Reason == "approval requested" {
			raised++
		}
	}
	assert.Equal(t, 1, raised)
}

// TestAgentCannotFlood: beyond its pending and waiting bounds an agent is
// refused at once; another agent is still asked about.
func TestAgentCannotFlood(t *testing.T) {
	b := &Broker{MaxPendingPerAgent: 3, MaxWaitingPerAgent: 5}
	p := askPolicy(t)
	for i := range 3 {
		ask(b, p, "a1", fmt.Sprintf("n%d.example", i), 443, "tls")
		pendingFor(t, b, fmt.Sprintf("n%d.example", i), 1)
	}
	d := wait(t, ask(b, p, "a1", "n3.example", 443, "tls"))
	assert.Equal(t, policy.ReasonApprovalBusy, d.Reason, "a fourth pending request")
	assert.Contains(t, policy.BoundReasons(), d.Reason, "the refusal is not counted as a bound's")
	ask(b, p, "a1", "n0.example", 443, "tls")
	ask(b, p, "a1", "n0.example", 443, "tls")
	pendingFor(t, b, "n0.example", 3)
	d = wait(t, ask(b, p, "a1", "n0.example", 443, "tls"))
	assert.Equal(t, policy.ReasonApprovalBusy, d.Reason, "a sixth waiting")
	ask(b, p, "a2", "n0.example", 443, "tls")
	pendingFor(t, b, "n0.example", 1)
	b.Close()
}

// TestWebhook: the webhook gets each new request signed, and its signed
// answer answers it; an answer with a wrong signature, or naming another
// request, does not, and the request times out refused.
func TestWebhook(t *testing.T) {
	secret := []byte("shared-secret")
	for _, tc := range []struct {
		name      string
		answerKey []byte
		otherID   bool
		allowed   bool
	}{
		{"signed answer", secret, false, true},
		{"wrong signature", []byte("guess"), false, false},
		{"another request's ID", secret, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				if !assert.NoError(t, Verify(secret, Asking, r.Header.Get(SignatureHeader), body, time.Now(), 0), "the gateway's request is signed") {
					return
				}
				var req Request
				require.NoError(t, json.Unmarshal(body, &req))
				got.Add(1)
				if tc.otherID {
					req.ID = "0000000000000000"
				}
				answer, _ := json.Marshal(webhookAnswer{ID: req.ID, Answer: Once})
				w.Header().Set(SignatureHeader, Sign(tc.answerKey, Answering, answer, time.Now()))
				w.Write(answer)
			}))
			defer srv.Close()
			b := &Broker{Timeout: 300 * time.Millisecond, Webhook: &Webhook{URL: srv.URL, Secret: secret}}
			d := wait(t, ask(b, askPolicy(t), "a1", "hook.example", 443, "tls"))
			assert.Equal(t, tc.allowed, d.Allowed, "%+v", d)
			if !tc.allowed {
				assert.Equal(t, policy.ReasonApprovalTimeout, d.Reason)
			} else {
				assert.Equal(t, "approved once by webhook", d.Reason)
			}
			assert.EqualValues(t, 1, got.Load())
		})
	}
}

func TestVerify(t *testing.T) {
	secret, body, now := []byte("s"), []byte(`{"id":"x"}`), time.Now()
	h := Sign(secret, Answering, body, now)
	assert.NoError(t, Verify(secret, Answering, h, body, now, 0))
	assert.ErrorIs(t, Verify(secret, Asking, h, body, now, 0), ErrBadSignature, "an answer passed off as a request")
	assert.ErrorIs(t, Verify(secret, Answering, h, []byte(`{"id":"y"}`), now, 0), ErrBadSignature, "another body")
	assert.ErrorIs(t, Verify([]byte("t"), Answering, h, body, now, 0), ErrBadSignature, "another secret")
	assert.ErrorIs(t, Verify(secret, Answering, h, body, now.Add(10*time.Minute), 0), ErrStale, "replayed later")
	assert.ErrorIs(t, Verify(secret, Answering, "t=1,v1=zz", body, now, 0), ErrBadSignature)
	assert.ErrorIs(t, Verify(secret, Answering, "", body, now, 0), ErrBadSignature)
}

func TestContextEndsTheWait(t *testing.T) {
	b := &Broker{}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan policy.Decision, 1)
	p := askPolicy(t)
	go func() { out <- policy.Ask(ctx, b, "a1", p.Decide("x.example", 443), 443, "tls", nil) }()
	pendingFor(t, b, "x.example", 1)
	cancel()
	d := wait(t, out)
	assert.False(t, d.Allowed)
	assert.Equal(t, policy.ReasonApprovalGone, d.Reason)
	b.Close()
}

// TestNoLeakAfterManyRefusals: 10,000 held and refused requests leave no
// goroutine and no state behind.
func TestNoLeakAfterManyRefusals(t *testing.T) {
	b := &Broker{MaxPendingPerAgent: 64, MaxWaitingPerAgent: 64}
	p := askPolicy(t)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	follow := b.Follow(ctx)
	var answerer sync.WaitGroup
	answerer.Go(func() {
		for req := range follow {
			b.Answer(req.ID, Deny, "test", false)
		}
	})
	var wg sync.WaitGroup
	var refusedN atomic.Int32
	for i := range 10_000 {
		wg.Go(func() {
			name := fmt.Sprintf("n%d.example", i%50)
			if !policy.Ask(context.Background(), b, "a1", p.Decide(name, 443), 443, "tls", nil).Allowed {
				refusedN.Add(1)
			}
		})
		if i%64 == 63 {
			wg.Wait() // as a sandbox's bounded handlers would
		}
	}
	wg.Wait()
	cancel()
	answerer.Wait()
	assert.EqualValues(t, 10_000, refusedN.Load())
	assert.Empty(t, b.Pending())
	b.mu.Lock()
	assert.Empty(t, b.waiting)
	assert.Empty(t, b.perAgent)
	assert.Empty(t, b.byID)
	b.mu.Unlock()
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+1 }, 5*time.Second, 10*time.Millisecond,
		"goroutines: %d before, %d after", before, runtime.NumGoroutine())
}

// TestExpiredGrantsAreDropped: the Deny cooldowns that requests to ever
// new names leave behind are dropped once they expire, not kept for the
// agent's life.
func TestExpiredGrantsAreDropped(t *testing.T) {
	b := &Broker{Timeout: time.Millisecond, DenyCooldown: time.Millisecond, AskRate: 1e6, MaxPendingPerAgent: 64, MaxWaitingPerAgent: 64}
	p := askPolicy(t)
	var wg sync.WaitGroup
	for i := range 2000 {
		wg.Go(func() {
			name := fmt.Sprintf("n%d.example", i)
			assert.False(t, policy.Ask(context.Background(), b, "a1", p.Decide(name, 443), 443, "tls", nil).Allowed)
		})
		if i%32 == 31 {
			wg.Wait()
		}
	}
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Less(t, len(b.grants["a1"]), 4*grantSweep, "expired grants kept")
}

// TestAskingIsBounded: a refused destination is refused at once for a
// while rather than asked about again; an agent raises requests at a
// bounded rate; after Close nothing is held.
func TestAskingIsBounded(t *testing.T) {
	b := &Broker{}
	p := askPolicy(t)
	ch := ask(b, p, "a1", "nag.example", 443, "tls")
	require.NoError(t, b.Answer(pendingFor(t, b, "nag.example", 1).ID, Deny, "alice", false))
	wait(t, ch)
	for range 5 {
		d := wait(t, ask(b, p, "a1", "nag.example", 443, "tls"))
		assert.Equal(t, policy.ReasonApprovalDenied+" (recently)", d.Reason)
	}
	assert.Empty(t, b.Pending(), "asked again about a destination just refused")

	rated := &Broker{AskRate: 0.001, MaxPendingPerAgent: 2}
	for i := range 2 {
		ask(rated, p, "a2", fmt.Sprintf("r%d.example", i), 443, "tls")
		pendingFor(t, rated, fmt.Sprintf("r%d.example", i), 1)
	}
	rated.Close()
	d := wait(t, ask(rated, p, "a2", "r9.example", 443, "tls"))
	assert.Equal(t, policy.ReasonApprovalGone, d.Reason, "held after Close")
}

// TestAlwaysThenNoMoreThanOnce: an always answer whose entry the
// policy has not taken yet carries to one connection after a lookup,
// not to every connection for a while.
func TestAlwaysThenNoMoreThanOnce(t *testing.T) {
	b := &Broker{OnAlways: func(string, string) error { return nil }, Timeout: 100 * time.Millisecond}
	p := askPolicy(t)
	ch := ask(b, p, "a1", "cp.example", 0, "dns")
	require.NoError(t, b.Answer(pendingFor(t, b, "cp.example", 1).ID, Always, "webhook", false))
	require.True(t, wait(t, ch).Allowed)
	assert.True(t, wait(t, ask(b, p, "a1", "cp.example", 443, "tls")).Allowed, "the connection after the lookup")
	assert.False(t, wait(t, ask(b, p, "a1", "cp.example", 443, "tls")).Allowed, "another one, timed out")
}

// TestAnswerThatPersistsIsNotRacedByAnother: while an always answer adds
// its entry, no other answer ends the request: the entry and the answer
// go together.
func TestAnswerThatPersistsIsNotRacedByAnother(t *testing.T) {
	inHook, release := make(chan struct{}), make(chan struct{})
	b := &Broker{OnAlways: func(string, string) error { close(inHook); <-release; return nil }}
	p := askPolicy(t)
	ch := ask(b, p, "a1", "x.example", 443, "tls")
	id := pendingFor(t, b, "x.example", 1).ID
	errc := make(chan error, 1)
	go func() { errc <- b.Answer(id, Always, "alice", false) }()
	<-inHook
	assert.ErrorIs(t, b.Answer(id, Deny, "webhook", false), ErrNotPending, "a second answer while the first persists")
	close(release)
	require.NoError(t, <-errc)
	assert.True(t, wait(t, ch).Allowed)
}
