package egresslog

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a clock a test steps: Now is what Advance set, and timers
// run in the goroutine that calls Advance, when it passes their time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c  *fakeClock
	at time.Time
	f  func()
}

func newFakeClock(t0 time.Time) *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) stopper {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Advance moves the clock on by d, running each timer that falls due, at
// its time, in order.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		i := slices.IndexFunc(c.timers, func(t *fakeTimer) bool { return !t.at.After(end) })
		if i < 0 {
			break
		}
		for j, t := range c.timers {
			if t.at.Before(c.timers[i].at) {
				i = j
			}
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		c.now = t.at
		c.mu.Unlock()
		t.f() // may set another timer
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// drain returns the records a follower has received so far.
func drain(f *Follower) []Record {
	var out []Record
	for {
		select {
		case r := <-f.C:
			out = append(out, r)
		default:
			return out
		}
	}
}

func summaries(rs []Record) (n int, count uint64) {
	for _, r := range rs {
		if r.Count > 0 {
			n++
			count += r.Count
		}
	}
	return n, count
}

// TestFloodKeepsEarlierDenial is the hostile agent: one denial worth
// keeping, then 200,000 refusals over its quota and 200,000 allowed
// records across four seconds. The denial is still listed, the rings and
// the files stay within their bounds, Stats count every refusal, and the
// summaries stand for every refusal not recorded on its own.
func TestFloodKeepsEarlierDenial(t *testing.T) {
	const (
		seconds   = 4
		perSecond = 50_000
		refusals  = seconds * perSecond
		burst     = 10
		keep      = 1000
		keepDen   = 500
		maxBytes  = 256 << 10
		keepFiles = 2
		quota     = "quota exceeded: dns queries"
	)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	sink, err := JSONFile{Path: path, MaxBytes: maxBytes, Keep: keepFiles}.Open()
	require.NoError(t, err)
	clk := newFakeClock(t0.Add(100 * time.Millisecond))
	l := &Log{Keep: keep, KeepDenied: keepDen, DenialBurst: burst, Sinks: []Sink{sink}, clock: clk}

	l.Record(Record{Agent: "a", Kind: KindTLS, Host: "exfil.example", Port: 443, Reason: "a deny entry matches", Rule: "exfil.example"})
	step := 800 * time.Millisecond / perSecond
	hosts := []string{"q0.flood.example", "q1.flood.example", "q2.flood.example"}
	for s := range seconds {
		for i := range perSecond {
			l.Record(Record{Agent: "a", Kind: KindDNS, Host: hosts[i%len(hosts)], Method: "A", Status: 5, Reason: quota})
			l.Record(Record{Agent: "a", Kind: KindTLS, Host: "api.github.com", Port: 443, Allowed: true, Reason: "allowed by rule", BytesUp: 1})
			clk.Advance(step)
			if i%4096 == 0 { // keep within the sink's queue, so the files see every record
				require.NoError(t, l.Flush(t.Context()))
			}
		}
		clk.Advance(t0.Add(time.Duration(s+1)*time.Second + 100*time.Millisecond).Sub(clk.Now()))
	}
	require.NoError(t, l.Shutdown(t.Context()))

	denied := l.List(Filter{Agent: "a", DeniedOnly: true}, 0)
	require.NotEmpty(t, denied)
	assert.Equal(t, "exfil.example", denied[0].Host, "the first denial was evicted")
	assert.Equal(t, "a deny entry matches", denied[0].Reason)

	a := l.agents["a"]
	assert.Len(t, a.allowed.recs, keep, "allowed ring")
	assert.LessOrEqual(t, len(a.denied.recs), keepDen, "denied ring")
	assert.LessOrEqual(t, cap(a.allowed.recs), keep, "allowed ring capacity")
	assert.LessOrEqual(t, cap(a.denied.recs), keepDen, "denied ring capacity")
	assert.Empty(t, a.folds, "refusals still pending after Shutdown")
	assert.Zero(t, clk.pending(), "a timer outlived Shutdown")

	st := l.Stats()["a"]
	assert.EqualValues(t, refusals+1, st.Denied, "Stats.Denied")
	assert.EqualValues(t, refusals, st.DeniedByReason[quota], "Stats.DeniedByReason")
	assert.EqualValues(t, 2*refusals+1, st.Records, "Stats.Records")

	var one int
	for _, r := range denied {
		if r.Reason == quota && r.Count == 0 {
			one++
		}
	}
	assert.Equal(t, seconds*burst, one, "refusals recorded one by one")
	n, count := summaries(denied)
	assert.Equal(t, seconds, n, "summaries: one a second")
	assert.EqualValues(t, refusals-seconds*burst, count, "summaries' counts")

	files, size := 0, int64(0)
	var lines, sumLines int
	for i := 0; i <= keepFiles+1; i++ {
		name := path
		if i > 0 {
			name = fmt.Sprintf("%s.%d", path, i)
		}
		data, err := os.ReadFile(name)
		if i == keepFiles+1 {
			assert.ErrorIs(t, err, os.ErrNotExist, "more rotated files than Keep")
			continue
		}
		require.NoError(t, err)
		files++
		size += int64(len(data))
		assert.LessOrEqual(t, len(data), maxBytes, "%s", name)
		for _, line := range splitLines(t, data) {
			r, err := ParseJSON(line)
			require.NoError(t, err, "%s: %q", name, line)
			lines++
			if r.Count > 0 {
				sumLines++
			}
		}
	}
	assert.Equal(t, keepFiles+1, files)
	assert.LessOrEqual(t, size, int64((keepFiles+1)*maxBytes), "disk use")
	assert.Positive(t, lines)
	assert.Positive(t, sumLines, "no summary in the newest files")
	dropped, failed := l.SinkStats()
	assert.Zero(t, dropped+failed, "sink dropped %d, failed %d", dropped, failed)
}

// TestDeniedRingEvictsAtExactlyN: denials are kept apart from allowed
// records, in a ring of their own, which any number of allowed records
// leave alone.
func TestDeniedRingEvictsAtExactlyN(t *testing.T) {
	l := &Log{Keep: 5, KeepDenied: 10, clock: newFakeClock(t0)}
	for i := range 11 {
		l.Record(Record{Agent: "a", Kind: KindTLS, Host: fmt.Sprintf("d%d.example", i), Allowed: true, Report: true, Reason: "no rule"})
	}
	for i := range 100 {
		l.Record(allowedRec("a", i))
	}
	denied := l.List(Filter{DeniedOnly: true}, 0)
	require.Len(t, denied, 10)
	assert.Equal(t, "d1.example", denied[0].Host)
	assert.Equal(t, "d10.example", denied[9].Host)
	all := l.List(Filter{}, 0)
	require.Len(t, all, 15, "both rings")
	assert.Equal(t, "d1.example", all[0].Host, "merged in Seq order")
	assert.Equal(t, "h95.example", all[10].Host, "merged in Seq order")
	newest := l.List(Filter{}, 3)
	assert.Equal(t, "h97.example", newest[0].Host, "limit keeps the newest")
}

func TestRingGrowsLazily(t *testing.T) {
	l := &Log{clock: newFakeClock(t0)}
	l.Record(allowedRec("a", 1))
	a := l.agents["a"]
	assert.Equal(t, minRingCap, cap(a.allowed.recs), "allowed ring after one record")
	assert.Zero(t, cap(a.denied.recs), "denied ring of an agent with no denial")
	assert.Nil(t, a.folds, "fold state of an agent with no refusal")
}

// TestSummaryEmittedWhenSecondEnds: the refusals beyond the burst are
// folded, and their summary comes when the second is over, with no other
// record to carry it.
func TestSummaryEmittedWhenSecondEnds(t *testing.T) {
	clk := newFakeClock(t0.Add(200 * time.Millisecond))
	l := &Log{DenialBurst: 3, clock: clk}
	f := l.Follow(t.Context(), Filter{}, 64)
	defer f.Close()
	for i := range 8 {
		l.Record(Record{Agent: "a", Kind: KindDNS, Host: fmt.Sprintf("x%d.example", i), Reason: "quota exceeded"})
		clk.Advance(time.Millisecond)
	}
	got := drain(f)
	require.Len(t, got, 3, "before the second ends: the burst only")
	for _, r := range got {
		assert.Zero(t, r.Count)
	}
	clk.Advance(790 * time.Millisecond) // t0+998ms: still the same second
	assert.Empty(t, drain(f), "a summary before its second ended")
	clk.Advance(2 * time.Millisecond)
	got = drain(f)
	require.Len(t, got, 1, "after the second ended")
	s := got[0]
	assert.EqualValues(t, 5, s.Count)
	assert.Equal(t, t0, s.Time.UTC(), "a summary's time is its second's start")
	assert.Equal(t, "x3.example", s.Host, "a summary's host is the first folded one")
	assert.Equal(t, KindDNS, s.Kind)
	assert.Equal(t, "quota exceeded", s.Reason)
	assert.Equal(t, "a", s.Agent)
	assert.False(t, s.Allowed)
	assert.Equal(t, s, l.List(Filter{}, 1)[0], "the ring has what followers get")
	assert.Zero(t, clk.pending(), "the timer runs on with nothing to emit")
	assert.EqualValues(t, 8, l.Stats()["a"].Denied)

	// A new second starts a new burst.
	for range 4 {
		l.Record(Record{Agent: "a", Kind: KindDNS, Reason: "quota exceeded"})
	}
	assert.Len(t, drain(f), 3)
	require.NoError(t, l.Shutdown(t.Context()))
	got = drain(f)
	require.Len(t, got, 1, "Shutdown emits what is pending")
	assert.Zero(t, got[0].Count, "one folded refusal is recorded as it was")
	assert.Equal(t, t0.Add(time.Second), got[0].Time.UTC())
}

// TestSummaryEmittedOnRealClock runs the real timer: the summary arrives
// within a second, by itself.
func TestSummaryEmittedOnRealClock(t *testing.T) {
	l := &Log{DenialBurst: 1}
	defer l.Close()
	f := l.Follow(t.Context(), Filter{}, 16)
	defer f.Close()
	// However the five fall on a second's end, one side has at least
	// three: two folded into a summary.
	for range 5 {
		l.Record(Record{Agent: "a", Kind: KindTCP, Reason: "no rule"})
	}
	var folded uint64
	deadline := time.After(3 * time.Second)
	for n := 0; n+int(folded) < 5; {
		select {
		case r := <-f.C:
			if r.Count > 0 {
				folded += r.Count
			} else {
				n++
			}
		case <-deadline:
			require.FailNow(t, "no summary within the second after the refusals")
		}
	}
	assert.GreaterOrEqual(t, folded, uint64(2))
}

// TestSummaryOnShutdown: a sink gets the pending summary before it
// closes, and no timer is left.
func TestSummaryOnShutdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	sink, err := JSONFile{Path: path}.Open()
	require.NoError(t, err)
	clk := newFakeClock(t0)
	l := &Log{DenialBurst: 2, Sinks: []Sink{sink}, clock: clk}
	for i := range 7 {
		l.Record(Record{Agent: "a", Kind: KindHTTP, Host: "h.example", Path: fmt.Sprintf("/%d", i), Reason: "budget spent"})
	}
	require.Equal(t, 1, clk.pending(), "the second's timer")
	require.NoError(t, l.Shutdown(t.Context()))
	assert.Zero(t, clk.pending(), "Shutdown left the timer")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := splitLines(t, data)
	require.Len(t, lines, 3)
	s, err := ParseJSON(lines[2])
	require.NoError(t, err)
	assert.EqualValues(t, 5, s.Count)
	assert.Contains(t, string(lines[2]), `"count":5`)

	// After Shutdown, nothing is folded: nothing could emit it.
	for range 5 {
		l.Record(Record{Agent: "a", Kind: KindHTTP, Reason: "budget spent"})
	}
	assert.Len(t, l.List(Filter{}, 0), 3+5)
}

// TestNeverFolded: report-mode records are allowed traffic, and allowed
// records are never folded, however many come in a second.
func TestNeverFolded(t *testing.T) {
	tests := []struct {
		name string
		r    Record
	}{
		{"allowed", Record{Allowed: true, Reason: "allowed by rule"}},
		{"report", Record{Allowed: true, Report: true, Reason: "no rule"}},
		{"report not allowed", Record{Allowed: false, Report: true, Reason: "no rule"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock(t0)
			l := &Log{DenialBurst: 1, clock: clk}
			for range 100 {
				r := tt.r
				r.Agent, r.Kind = "a", KindTLS
				l.Record(r)
			}
			got := l.List(Filter{}, 0)
			assert.Len(t, got, 100)
			n, _ := summaries(got)
			assert.Zero(t, n, "summaries")
			assert.Zero(t, clk.pending(), "a timer for records never folded")
		})
	}
}

// TestConnEndFolded: a refused connection, recorded at its end, passes
// the same bound as any record.
func TestConnEndFolded(t *testing.T) {
	clk := newFakeClock(t0)
	l := &Log{DenialBurst: 2, clock: clk}
	for range 5 {
		c := l.Begin(Record{Agent: "a", Kind: KindTCP, Host: "db.example", Port: 5432})
		c.End(Record{Agent: "a", Kind: KindTCP, Host: "db.example", Port: 5432, Reason: "connection budget spent"})
	}
	clk.Advance(time.Second)
	got := l.List(Filter{}, 0)
	require.Len(t, got, 3)
	assert.EqualValues(t, 3, got[2].Count)
	assert.Equal(t, "connection budget spent", got[2].Reason)
}

// TestFoldStateBounded: an agent provoking many distinct reasons cannot
// grow the fold state; beyond the bound its refusals fold under
// OtherReason, and every refusal is still counted.
func TestFoldStateBounded(t *testing.T) {
	const reasons, each = 100, 20
	clk := newFakeClock(t0)
	l := &Log{DenialBurst: 10, clock: clk}
	for i := range reasons * each {
		l.Record(Record{Agent: "a", Kind: KindDNS, Reason: fmt.Sprintf("upstream failed: address %d", i%reasons)})
	}
	for k := range 20 { // more kinds than the catch-alls
		l.Record(Record{Agent: "a", Kind: Kind(fmt.Sprintf("k%d", k)), Reason: "odd"})
	}
	a := l.agents["a"]
	a.mu.Lock()
	held := len(a.folds)
	_, other := a.folds[foldKey{KindDNS, OtherReason}]
	a.mu.Unlock()
	assert.LessOrEqual(t, held, maxFoldKeys+maxFoldKinds+1, "fold state")
	assert.True(t, other, "no catch-all for the kind")
	clk.Advance(time.Second)
	got := l.List(Filter{}, 0)
	var one int
	var count uint64
	for _, r := range got {
		if r.Count > 0 {
			count += r.Count
		} else {
			one++
		}
	}
	assert.EqualValues(t, reasons*each+20, uint64(one)+count, "records and summaries stand for every refusal")
	assert.EqualValues(t, reasons*each+20, l.Stats()["a"].Denied)
	var otherCount uint64
	for _, r := range got {
		if r.Kind == KindDNS && r.Reason == OtherReason {
			otherCount += r.Count
		}
	}
	assert.EqualValues(t, (reasons-maxFoldKeys)*each-10, otherCount, "folded under the catch-all")
}

// BenchmarkRecordRefused records refusals of one agent, kind and reason:
// all but the burst of each second are folded.
func BenchmarkRecordRefused(b *testing.B) {
	l := &Log{}
	defer l.Close()
	r := Record{Agent: "agent-1", Kind: KindDNS, Host: "q.flood.example", Method: "A", Status: 5, Reason: "quota exceeded: dns queries"}
	b.ReportAllocs()
	for b.Loop() {
		l.Record(r)
	}
}

// TestRingBoundChanged: a ring whose bound changes after it wrapped keeps
// the newest records, in order, within the new bound.
func TestRingBoundChanged(t *testing.T) {
	var g ring
	push := func(from, to, keep int) {
		for i := from; i < to; i++ {
			g.push(&Record{Seq: uint64(i)}, keep)
		}
	}
	seqs := func() []uint64 {
		var out []uint64
		for _, r := range g.appendMatching(nil, &Filter{}) {
			out = append(out, r.Seq)
		}
		return out
	}
	push(1, 8, 5)
	assert.Equal(t, []uint64{3, 4, 5, 6, 7}, seqs(), "wrapped")
	push(8, 10, 8)
	assert.Equal(t, []uint64{3, 4, 5, 6, 7, 8, 9}, seqs(), "raised")
	push(10, 13, 8)
	assert.Equal(t, []uint64{5, 6, 7, 8, 9, 10, 11, 12}, seqs(), "raised, wrapped")
	push(13, 14, 3)
	assert.Equal(t, []uint64{11, 12, 13}, seqs(), "lowered")
	assert.LessOrEqual(t, cap(g.recs), 3)
}
