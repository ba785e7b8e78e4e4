package egresslog

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func rec(agent string, i int) Record {
	return Record{Agent: agent, Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Port: 443, Allowed: i%3 != 0, Reason: "r"}
}

// allowedRec is rec, always allowed: allowed records share one ring.
func allowedRec(agent string, i int) Record {
	r := rec(agent, i)
	r.Allowed = true
	return r
}

func TestRingEvictsAtExactlyN(t *testing.T) {
	l := &Log{Keep: 10}
	for i := 0; i < 10; i++ {
		l.Record(allowedRec("a", i))
	}
	got := l.List(Filter{Agent: "a"}, 0)
	require.Len(t, got, 10, "after N records: kept")
	assert.Equal(t, "h0.example", got[0].Host, "after N records: first")
	assert.Equal(t, "h9.example", got[9].Host, "after N records: last")
	l.Record(allowedRec("a", 10))
	got = l.List(Filter{Agent: "a"}, 0)
	require.Len(t, got, 10, "after N+1 records: kept")
	assert.Equal(t, "h1.example", got[0].Host, "after N+1 records: first")
	assert.Equal(t, "h10.example", got[9].Host, "after N+1 records: last")
	for i := 11; i < 35; i++ {
		l.Record(allowedRec("a", i))
	}
	got = l.List(Filter{Agent: "a"}, 3)
	require.Len(t, got, 3, "newest 3 after wrapping")
	assert.Equal(t, "h32.example", got[0].Host, "newest 3 after wrapping: first")
	assert.Equal(t, "h34.example", got[2].Host, "newest 3 after wrapping: last")
	for i := 1; i < len(got); i++ {
		assert.Greater(t, got[i].Seq, got[i-1].Seq, "not oldest first: %d then %d", got[i-1].Seq, got[i].Seq)
	}
}

func TestDefaultKeep(t *testing.T) {
	var l Log // the zero Log works
	for i := 0; i < DefaultKeep+5; i++ {
		l.Record(allowedRec("a", i))
	}
	assert.Equal(t, DefaultKeep, len(l.List(Filter{}, 0)), "allowed records kept by the zero Log")
	for i := 0; i < DefaultKeep+5; i++ {
		r := allowedRec("a", i)
		r.Report = true // denied in the log's sense, and never folded
		l.Record(r)
	}
	assert.Equal(t, DefaultKeep, len(l.List(Filter{DeniedOnly: true}, 0)), "denied records kept by the zero Log")
	assert.Equal(t, 2*DefaultKeep, len(l.List(Filter{}, 0)), "records kept by the zero Log")
}

func TestListFilters(t *testing.T) {
	l := &Log{}
	t0 := time.Now()
	l.Record(Record{Agent: "a", Kind: KindDNS, Host: "x", Allowed: true, Time: t0.Add(-time.Hour)})
	l.Record(Record{Agent: "a", Kind: KindTLS, Host: "y", Allowed: false, Reason: "no rule", Time: t0})
	l.Record(Record{Agent: "b", Kind: KindTLS, Host: "z", Allowed: true, Report: true, Reason: "no rule", Time: t0})
	l.Record(Record{Agent: "b", Kind: KindHTTP, Host: "w", Allowed: true, Time: t0.Add(time.Second)})
	tests := []struct {
		f     Filter
		hosts string
	}{
		{Filter{}, "x y z w"},
		{Filter{Agent: "a"}, "x y"},
		{Filter{Agent: "nobody"}, ""},
		{Filter{Kind: KindTLS}, "y z"},
		{Filter{DeniedOnly: true}, "y z"},
		{Filter{Since: t0}, "y z w"},
		{Filter{Agent: "b", Kind: KindHTTP}, "w"},
	}
	for _, tt := range tests {
		var hosts []string
		for _, r := range l.List(tt.f, 0) {
			hosts = append(hosts, r.Host)
		}
		assert.Equal(t, tt.hosts, strings.Join(hosts, " "), "List(%+v)", tt.f)
	}
}

func TestAgentBound(t *testing.T) {
	l := &Log{MaxAgents: 3}
	base := time.Now()
	for i, a := range []string{"a", "b", "c"} {
		l.Record(Record{Agent: a, Allowed: true, Time: base.Add(time.Duration(i) * time.Second)})
	}
	l.Record(Record{Agent: "a", Allowed: true, Time: base.Add(10 * time.Second)}) // a is fresh again
	l.Record(Record{Agent: "d", Allowed: true, Time: base.Add(11 * time.Second)})
	agents := l.Agents()
	assert.Len(t, agents, 3, "agents")
	assert.NotContains(t, strings.Join(agents, ""), "b", "agents = %v, want b (least recently written) evicted", agents)
	l.Forget("a")
	assert.Empty(t, l.List(Filter{Agent: "a"}, 0), "Forget kept records")
}

func TestOpenConns(t *testing.T) {
	l := &Log{}
	c := l.Begin(Record{Agent: "a", Kind: KindTLS, Host: "api.github.com", Port: 443, Allowed: true})
	open := l.OpenConns("a")
	require.Len(t, open, 1, "OpenConns")
	assert.True(t, open[0].Open, "OpenConns = %+v: not marked open", open)
	assert.Equal(t, "api.github.com", open[0].Host, "OpenConns host")
	assert.Empty(t, l.List(Filter{}, 0), "an open connection was recorded before it closed")
	c.End(Record{Agent: "a", Kind: KindTLS, Host: "api.github.com", Port: 443, Allowed: true, BytesUp: 10, BytesDown: 20})
	c.End(Record{Agent: "a"}) // second End does nothing
	assert.Empty(t, l.OpenConns(""), "open after End")
	got := l.List(Filter{}, 0)
	require.Len(t, got, 1, "closed records")
	assert.False(t, got[0].Open, "closed record = %+v: still marked open", got[0])
	assert.Equal(t, int64(20), got[0].BytesDown, "closed record BytesDown")
	assert.Positive(t, got[0].Duration, "closed record Duration")
	s := l.Stats()["a"]
	assert.Equal(t, uint64(10), s.BytesUp, "stats BytesUp")
	assert.Equal(t, uint64(20), s.BytesDown, "stats BytesDown")
	assert.Equal(t, uint64(1), s.Records, "stats Records")
}

func TestStats(t *testing.T) {
	l := &Log{}
	l.Record(Record{Agent: "a", Allowed: false, Reason: "no rule"})
	l.Record(Record{Agent: "a", Allowed: false, Reason: "no rule"})
	l.Record(Record{Agent: "a", Allowed: true, Report: true, Reason: "port"})
	l.Record(Record{Agent: "a", Allowed: true, Secret: "github", BytesUp: 5, BytesDown: 7})
	for i := 0; i < 100; i++ {
		l.Record(Record{Agent: "b", Allowed: false, Reason: fmt.Sprintf("reason %d", i)})
	}
	st := l.Stats()
	a := st["a"]
	assert.Equal(t, uint64(4), a.Records, "stats a: Records")
	assert.Equal(t, uint64(3), a.Denied, "stats a: Denied")
	assert.Equal(t, uint64(2), a.DeniedByReason["no rule"], "stats a: DeniedByReason[no rule]")
	assert.Equal(t, uint64(1), a.DeniedByReason["port"], "stats a: DeniedByReason[port]")
	assert.Equal(t, uint64(1), a.Injected, "stats a: Injected")
	assert.Equal(t, uint64(5), a.BytesUp, "stats a: BytesUp")
	assert.Equal(t, uint64(7), a.BytesDown, "stats a: BytesDown")
	b := st["b"]
	assert.Len(t, b.DeniedByReason, maxReasonKeys+1, "stats b: reasons")
	assert.Equal(t, uint64(100-maxReasonKeys), b.DeniedByReason["other"], "stats b: other")
	assert.Equal(t, uint64(100), b.Denied, "stats b: Denied")
	a.DeniedByReason["no rule"] = 99 // a copy
	assert.Equal(t, uint64(2), l.Stats()["a"].DeniedByReason["no rule"], "Stats returned the live map")
}

// TestConcurrentWritersAndFollowers runs many writers and followers at
// once; under -race it checks the locking, and it checks that every
// follower that keeps up sees every record in order.
func TestConcurrentWritersAndFollowers(t *testing.T) {
	const writers, perWriter, followers = 8, 500, 4
	var sinkBuf safeBuffer
	l := &Log{Keep: 100, Sinks: []Sink{NewJSONSink(&sinkBuf)}, SinkQueue: writers * perWriter, DenialBurst: writers * perWriter}
	ctx := t.Context()
	var fs []*Follower
	for i := 0; i < followers; i++ {
		fs = append(fs, l.Follow(ctx, Filter{}, writers*perWriter))
	}
	slow := l.Follow(ctx, Filter{}, 1) // never read until the end
	denied := l.Follow(ctx, Filter{DeniedOnly: true}, writers*perWriter)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				l.Record(rec(fmt.Sprintf("agent-%d", w%3), i))
				if i%50 == 0 {
					l.List(Filter{}, 10)
					l.Stats()
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range fs {
		f.Close()
		n, last := 0, uint64(0)
		for r := range f.C {
			assert.Greater(t, r.Seq, last, "follower saw seq %d after %d", r.Seq, last)
			last = r.Seq
			n++
		}
		assert.Equal(t, writers*perWriter, n, "follower got records")
		assert.Zero(t, f.Lost(), "follower lost records")
	}
	slow.Close()
	buffered := uint64(len(slow.C))
	assert.Equal(t, uint64(writers*perWriter), buffered+slow.Lost(), "slow follower: %d buffered, %d lost", buffered, slow.Lost())
	assert.NotZero(t, slow.Lost(), "slow follower: %d buffered, none lost", buffered)
	denied.Close()
	nDenied := 0
	for r := range denied.C {
		assert.False(t, r.Allowed, "denied-only follower got %+v", r)
		nDenied++
	}
	assert.Equal(t, writers*((perWriter+2)/3), nDenied, "denied follower got records")
	require.NoError(t, l.Shutdown(context.Background()))
	dropped, failed := l.SinkStats()
	assert.Equal(t, writers*perWriter, bytes.Count(sinkBuf.Bytes(), []byte("\n")), "sink wrote lines (dropped %d, failed %d)", dropped, failed)
}

func TestFollowStopsWithContext(t *testing.T) {
	l := &Log{}
	ctx, cancel := context.WithCancel(context.Background())
	f := l.Follow(ctx, Filter{Agent: "a"}, 4)
	l.Record(rec("a", 1))
	l.Record(rec("b", 1))
	cancel()
	var got []Record
	for r := range f.C { // closed by the cancel
		got = append(got, r)
	}
	require.Len(t, got, 1, "follower got %+v", got)
	assert.Equal(t, "a", got[0].Agent, "follower got %+v", got)
	l.Record(rec("a", 2)) // no panic after the follower is gone
}

// blockingWriter blocks every write until released.
type blockingWriter struct{ release chan struct{} }

func (w blockingWriter) Write(p []byte) (int, error) { <-w.release; return len(p), nil }

type failingSink struct{}

func (failingSink) WriteRecord(*Record) error { return errors.New("disk full") }
func (failingSink) Flush() error              { return errors.New("disk full") }

// TestSinksNeverBlock records through a sink that blocks and one that
// fails: recording finishes, the ring has every record, and the losses are
// counted.
func TestSinksNeverBlock(t *testing.T) {
	bw := blockingWriter{release: make(chan struct{})}
	l := &Log{Keep: 1000, DenialBurst: 1000, SinkQueue: 4, Sinks: []Sink{failingSink{}, &JSONSink{w: bufio.NewWriterSize(bw, 16)}}}
	done := make(chan struct{})
	go func() {
		for i := 0; i < 1000; i++ {
			l.Record(rec("a", i))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "recording blocked behind a blocked sink")
	}
	assert.Equal(t, 1000, len(l.List(Filter{}, 0)), "records in the ring")
	dropped, _ := l.SinkStats()
	assert.NotZero(t, dropped, "no record was dropped for the blocked sink")
	close(bw.release)
	require.NoError(t, l.Shutdown(context.Background()))
	_, failed := l.SinkStats()
	assert.NotZero(t, failed, "the failing sink's errors were not counted")
}

// TestAStalledSinkCostsOthersNothing: while one sink is stalled (a
// stderr nobody reads), an audit trail beside it keeps every record and
// verifies; the stalled sink is told in place how many it lost.
func TestAStalledSinkCostsOthersNothing(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	file, err := JSONFile{Path: path, Seal: key}.Open()
	require.NoError(t, err)
	bw := blockingWriter{release: make(chan struct{})}
	var stalled bytes.Buffer
	const queue, n = 64, 512
	l := &Log{Keep: n, DenialBurst: n, SinkQueue: queue, Sinks: []Sink{file, NewJSONSink(io.MultiWriter(bw, &stalled))}}
	lines := func() int {
		data, _ := os.ReadFile(path)
		return bytes.Count(data, []byte(`"agent":"a"`))
	}
	for i := range n {
		l.Record(allowedRec("a", i))
		if i%(queue/2) == queue/2-1 {
			require.Eventually(t, func() bool { return lines() == i+1 }, 5*time.Second, time.Millisecond,
				"the trail stopped behind the stalled sink")
		}
	}
	dropped, _ := l.SinkStats()
	assert.NotZero(t, dropped, "nothing was dropped for the stalled sink")
	close(bw.release)
	require.NoError(t, l.Shutdown(t.Context()))
	assert.Equal(t, n, lines())
	v, err := Verify(pub, path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Contains(t, stalled.String(), fmt.Sprintf(`{"dropped":%d,`, dropped), "the stalled sink was not told of its gap")
}

func TestCloseTimesOut(t *testing.T) {
	bw := blockingWriter{release: make(chan struct{})}
	defer close(bw.release)
	l := &Log{Sinks: []Sink{&JSONSink{w: bufio.NewWriterSize(bw, 16)}}}
	l.Record(rec("a", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, l.Shutdown(ctx), context.DeadlineExceeded, "Close must return the context's error")
}

func TestJSONFileSink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	s, err := OpenJSONFile(path)
	require.NoError(t, err)
	l := &Log{Sinks: []Sink{s}}
	l.Record(Record{Agent: "a", Kind: KindHTTP, Host: "h", Path: "/p?token=x", Allowed: true})
	require.NoError(t, l.Shutdown(context.Background()))
	require.NoError(t, s.Close())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "log file mode")
	data, _ := os.ReadFile(path)
	r, err := ParseJSON(bytes.TrimSpace(data))
	require.NoError(t, err, "file: %s", data)
	assert.Equal(t, "/p", r.Path, "file: %s", data)
	assert.NotContains(t, string(data), "token", "file: %s", data)
}

func TestSlogSink(t *testing.T) {
	var buf bytes.Buffer
	l := &Log{Sinks: []Sink{SlogSink{Logger: slog.New(slog.NewTextHandler(&buf, nil))}}}
	l.Record(Record{Agent: "a", Kind: KindTLS, Host: "evil.example", Port: 443, Reason: "no rule"})
	l.Record(Record{Agent: "a", Kind: KindHTTP, Host: "ok.example", Port: 443, Allowed: true, Secret: "gh", Status: 200})
	require.NoError(t, l.Shutdown(context.Background()))
	require.NoError(t, SlogSink{Logger: slog.New(slog.NewTextHandler(&buf, nil))}.WriteRecord(&Record{Agent: "a", Kind: KindDNS, Reason: "quota", Count: 42}))
	out := buf.String()
	for _, want := range []string{`level=WARN msg="egress denied"`, "host=evil.example", `reason="no rule"`, `level=INFO msg="egress allowed"`, "secret=gh", "status=200", "count=42"} {
		assert.Contains(t, out, want, "slog output lacks %q", want)
	}
}

type safeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *safeBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// BenchmarkRecord records into one ring and one JSON sink, and waits for
// the sink to write every record, so the time per record is the whole
// cost on this machine's cores.
func BenchmarkRecord(b *testing.B) {
	l := &Log{Sinks: []Sink{NewJSONSink(io.Discard)}}
	r := Record{Agent: "agent-1", Kind: KindHTTP, Host: "api.github.com", Port: 443, Method: "GET", Path: "/repos/x/y",
		Status: 200, Allowed: true, Reason: "allowed by rule", Rule: "api.github.com", Secret: "github", BytesUp: 300, BytesDown: 4000,
		Duration: 12 * time.Millisecond}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Record(r)
		if i++; i%1024 == 0 { // stay within the sink queue
			require.NoError(b, l.Flush(context.Background()))
		}
	}
	require.NoError(b, l.Shutdown(context.Background()))
	b.StopTimer()
	dropped, failed := l.SinkStats()
	require.Zero(b, dropped+failed, "sink dropped %d, failed %d", dropped, failed)
}

// TestListLimitIsTheNewest: a listing with a limit is the newest records
// of the whole listing, in order, across agents and both rings.
func TestListLimitIsTheNewest(t *testing.T) {
	l := &Log{Keep: 50, KeepDenied: 50}
	for i := range 400 {
		l.Record(Record{Agent: fmt.Sprintf("a%d", i%3), Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Port: 443, Allowed: i%4 != 0, Reason: "r"})
	}
	all := l.List(Filter{}, 0)
	for _, limit := range []int{1, 7, 60, 299, 1000} {
		got := l.List(Filter{}, limit)
		want := all[max(0, len(all)-limit):]
		assert.Equal(t, want, got, "limit %d", limit)
	}
	denied := l.List(Filter{Agent: "a1", DeniedOnly: true}, 0)
	assert.Equal(t, denied[len(denied)-5:], l.List(Filter{Agent: "a1", DeniedOnly: true}, 5))
}
