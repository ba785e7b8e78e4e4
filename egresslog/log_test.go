package egresslog

import (
	"bufio"
	"bytes"
	"context"
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
)

func rec(agent string, i int) Record {
	return Record{Agent: agent, Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Port: 443, Allowed: i%3 != 0, Reason: "r"}
}

func TestRingEvictsAtExactlyN(t *testing.T) {
	l := &Log{Keep: 10}
	for i := 0; i < 10; i++ {
		l.Record(rec("a", i))
	}
	got := l.List(Filter{Agent: "a"}, 0)
	if len(got) != 10 || got[0].Host != "h0.example" || got[9].Host != "h9.example" {
		t.Fatalf("after N records: %d kept, first %q", len(got), got[0].Host)
	}
	l.Record(rec("a", 10))
	got = l.List(Filter{Agent: "a"}, 0)
	if len(got) != 10 || got[0].Host != "h1.example" || got[9].Host != "h10.example" {
		t.Fatalf("after N+1 records: %d kept, first %q last %q", len(got), got[0].Host, got[9].Host)
	}
	for i := 11; i < 35; i++ {
		l.Record(rec("a", i))
	}
	got = l.List(Filter{Agent: "a"}, 3)
	if len(got) != 3 || got[0].Host != "h32.example" || got[2].Host != "h34.example" {
		t.Fatalf("newest 3 after wrapping: %+v", got)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			t.Fatalf("not oldest first: %d then %d", got[i-1].Seq, got[i].Seq)
		}
	}
}

func TestDefaultKeep(t *testing.T) {
	var l Log // the zero Log works
	for i := 0; i < DefaultKeep+5; i++ {
		l.Record(rec("a", i))
	}
	if n := len(l.List(Filter{}, 0)); n != DefaultKeep {
		t.Fatalf("zero Log kept %d records, want %d", n, DefaultKeep)
	}
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
		if got := strings.Join(hosts, " "); got != tt.hosts {
			t.Errorf("List(%+v) = %q, want %q", tt.f, got, tt.hosts)
		}
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
	if len(agents) != 3 || strings.Contains(strings.Join(agents, ""), "b") {
		t.Fatalf("agents = %v, want b (least recently written) evicted", agents)
	}
	l.Forget("a")
	if len(l.List(Filter{Agent: "a"}, 0)) != 0 {
		t.Fatal("Forget kept records")
	}
}

func TestOpenConns(t *testing.T) {
	l := &Log{}
	c := l.Begin(Record{Agent: "a", Kind: KindTLS, Host: "api.github.com", Port: 443, Allowed: true})
	open := l.OpenConns("a")
	if len(open) != 1 || !open[0].Open || open[0].Host != "api.github.com" {
		t.Fatalf("OpenConns = %+v", open)
	}
	if len(l.List(Filter{}, 0)) != 0 {
		t.Fatal("an open connection was recorded before it closed")
	}
	c.End(Record{Agent: "a", Kind: KindTLS, Host: "api.github.com", Port: 443, Allowed: true, BytesUp: 10, BytesDown: 20})
	c.End(Record{Agent: "a"}) // second End does nothing
	if n := len(l.OpenConns("")); n != 0 {
		t.Fatalf("%d open after End", n)
	}
	got := l.List(Filter{}, 0)
	if len(got) != 1 || got[0].Open || got[0].BytesDown != 20 || got[0].Duration <= 0 {
		t.Fatalf("closed record = %+v", got)
	}
	s := l.Stats()["a"]
	if s.BytesUp != 10 || s.BytesDown != 20 || s.Records != 1 {
		t.Fatalf("stats = %+v", s)
	}
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
	if a.Records != 4 || a.Denied != 3 || a.DeniedByReason["no rule"] != 2 || a.DeniedByReason["port"] != 1 || a.Injected != 1 || a.BytesUp != 5 || a.BytesDown != 7 {
		t.Errorf("stats a = %+v", a)
	}
	b := st["b"]
	if len(b.DeniedByReason) != maxReasonKeys+1 || b.DeniedByReason["other"] != 100-maxReasonKeys || b.Denied != 100 {
		t.Errorf("stats b: %d reasons, other=%d", len(b.DeniedByReason), b.DeniedByReason["other"])
	}
	a.DeniedByReason["no rule"] = 99 // a copy
	if l.Stats()["a"].DeniedByReason["no rule"] != 2 {
		t.Error("Stats returned the live map")
	}
}

// TestConcurrentWritersAndFollowers runs many writers and followers at
// once; under -race it checks the locking, and it checks that every
// follower that keeps up sees every record in order.
func TestConcurrentWritersAndFollowers(t *testing.T) {
	const writers, perWriter, followers = 8, 500, 4
	var sinkBuf safeBuffer
	l := &Log{Keep: 100, Sinks: []Sink{NewJSONSink(&sinkBuf)}, SinkQueue: writers * perWriter}
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
			if r.Seq <= last {
				t.Fatalf("follower saw seq %d after %d", r.Seq, last)
			}
			last = r.Seq
			n++
		}
		if n != writers*perWriter || f.Lost() != 0 {
			t.Fatalf("follower got %d records, lost %d", n, f.Lost())
		}
	}
	slow.Close()
	if got := uint64(len(slow.C)); got+slow.Lost() != writers*perWriter || slow.Lost() == 0 {
		t.Fatalf("slow follower: %d buffered, %d lost", got, slow.Lost())
	}
	denied.Close()
	nDenied := 0
	for r := range denied.C {
		if r.Allowed {
			t.Fatalf("denied-only follower got %+v", r)
		}
		nDenied++
	}
	if nDenied != writers*((perWriter+2)/3) {
		t.Fatalf("denied follower got %d", nDenied)
	}
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lines := bytes.Count(sinkBuf.Bytes(), []byte("\n")); lines != writers*perWriter {
		dropped, failed := l.SinkStats()
		t.Fatalf("sink wrote %d lines (dropped %d, failed %d)", lines, dropped, failed)
	}
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
	if len(got) != 1 || got[0].Agent != "a" {
		t.Fatalf("follower got %+v", got)
	}
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
	l := &Log{Keep: 1000, SinkQueue: 4, Sinks: []Sink{failingSink{}, &JSONSink{w: bufio.NewWriterSize(bw, 16)}}}
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
		t.Fatal("recording blocked behind a blocked sink")
	}
	if n := len(l.List(Filter{}, 0)); n != 1000 {
		t.Fatalf("ring has %d records", n)
	}
	if dropped, _ := l.SinkStats(); dropped == 0 {
		t.Fatal("no record was dropped for the blocked sink")
	}
	close(bw.release)
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, failed := l.SinkStats(); failed == 0 {
		t.Fatal("the failing sink's errors were not counted")
	}
}

func TestCloseTimesOut(t *testing.T) {
	bw := blockingWriter{release: make(chan struct{})}
	defer close(bw.release)
	l := &Log{Sinks: []Sink{&JSONSink{w: bufio.NewWriterSize(bw, 16)}}}
	l.Record(rec("a", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want the context's error", err)
	}
}

func TestJSONFileSink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	s, err := OpenJSONFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l := &Log{Sinks: []Sink{s}}
	l.Record(Record{Agent: "a", Kind: KindHTTP, Host: "h", Path: "/p?token=x", Allowed: true})
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("log file mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	r, err := ParseJSON(bytes.TrimSpace(data))
	if err != nil || r.Path != "/p" || strings.Contains(string(data), "token") {
		t.Fatalf("file: %s (%v)", data, err)
	}
}

func TestSlogSink(t *testing.T) {
	var buf bytes.Buffer
	l := &Log{Sinks: []Sink{SlogSink{Logger: slog.New(slog.NewTextHandler(&buf, nil))}}}
	l.Record(Record{Agent: "a", Kind: KindTLS, Host: "evil.example", Port: 443, Reason: "no rule"})
	l.Record(Record{Agent: "a", Kind: KindHTTP, Host: "ok.example", Port: 443, Allowed: true, Secret: "gh", Status: 200})
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{`level=WARN msg="egress denied"`, "host=evil.example", `reason="no rule"`, `level=INFO msg="egress allowed"`, "secret=gh", "status=200"} {
		if !strings.Contains(out, want) {
			t.Errorf("slog output lacks %q:\n%s", want, out)
		}
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
			if err := l.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := l.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if dropped, failed := l.SinkStats(); dropped+failed != 0 {
		b.Fatalf("sink dropped %d, failed %d", dropped, failed)
	}
}
