package egresslog

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Sink receives every record from a goroutine of the Log's that serves it
// alone, from a queue of its own (so a sink's calls never overlap, and
// calls to two sinks may). WriteRecord may be slow or fail: the Log
// counts failures and drops records while the sink's queue is full (a
// GapSink is told where), and never waits for a sink. The *Record is
// valid only during the call.
type Sink interface {
	WriteRecord(r *Record) error
	// Flush is called when the queue is empty, so buffered sinks write out.
	Flush() error
}

// A GapSink is told, in place, of the records the Log dropped for it
// because its queue was full: WriteGap(n) comes before the record that
// follows them (or, for those dropped last, before the sink is closed).
// JSONSink writes it as a line of its own ({"dropped":n,"time":…}),
// chained in an audit trail, so that the file says where it lacks
// records rather than hiding the gap.
type GapSink interface {
	WriteGap(n uint64) error
}

// sinkQueue is one sink's queue, drained by a goroutine of its own: a
// sink that stalls (a stderr nobody reads) loses its own records, never
// another sink's (the audit trail's).
type sinkQueue struct {
	sink    Sink
	ch      chan queued
	dropped uint64 // dropped since the last record queued; guarded by pubMu
}

// queued is a record for a sink, and how many were dropped for the sink
// just before it.
type queued struct {
	r   Record
	gap uint64
}

// drain hands q's records to its sink until Shutdown, flushing it
// whenever the queue runs empty, then closes the sink.
func (l *Log) drain(q *sinkQueue) {
	for item := range q.ch {
		l.writeGap(q.sink, item.gap)
		if err := q.sink.WriteRecord(&item.r); err != nil {
			l.sinkErrors.Add(1)
		}
		if len(q.ch) == 0 {
			if err := q.sink.Flush(); err != nil {
				l.sinkErrors.Add(1)
			}
		}
		l.doneWith()
	}
	l.writeGap(q.sink, q.dropped) // the channel is closed: no more drops
	if c, ok := q.sink.(io.Closer); ok {
		if err := c.Close(); err != nil {
			l.sinkErrors.Add(1)
		}
	} else if err := q.sink.Flush(); err != nil {
		l.sinkErrors.Add(1)
	}
}

// writeGap tells sink, if it listens, of n records dropped for it.
func (l *Log) writeGap(sink Sink, n uint64) {
	if g, ok := sink.(GapSink); ok && n > 0 {
		if err := g.WriteGap(n); err != nil {
			l.sinkErrors.Add(1)
		}
	}
}

// doneWith counts out one record queued for a sink, written or dropped,
// and wakes Flush's waiters once none is left.
func (l *Log) doneWith() {
	l.idleMu.Lock()
	defer l.idleMu.Unlock()
	if l.sinkPending.Add(-1) == 0 {
		for _, w := range l.idleWaiters {
			close(w)
		}
		l.idleWaiters = nil
	}
}

// Shutdown emits the summaries of refusals still pending, stops
// accepting records for the sinks, waits until the queued ones are written
// or ctx is done, and flushes and closes the sinks. The rings stay readable; records added
// after Shutdown reach the rings, one by one (refusals are no longer
// folded), but not the sinks.
func (l *Log) Shutdown(ctx context.Context) error {
	l.init()
	var err error
	l.closeOnce.Do(func() {
		// Writers check closed and send under pubMu, so once it is held no
		// send is in flight and none will start.
		l.pubMu.Lock()
		if l.foldTimer != nil {
			l.foldTimer.Stop()
			l.foldTimer = nil
		}
		l.emitFoldsLocked(0, true)
		l.closed.Store(true)
		for _, q := range l.queues {
			close(q.ch)
		}
		l.pubMu.Unlock()
		if l.queues == nil {
			return
		}
		select {
		case <-l.sinkDone:
		case <-ctx.Done():
			err = fmt.Errorf("egresslog: shutdown: %w", ctx.Err())
		}
	})
	return err
}

// Close emits the summaries of refusals still pending and stops accepting
// records for the sinks at once; those already queued are still written,
// in the background, and the sinks then closed. It is safe to call more
// than once, and after Shutdown.
func (l *Log) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Shutdown(ctx) // a cancelled shutdown reports only that it did not wait
	return nil
}

// Flush waits until every record queued so far has been written to the
// sinks and the sinks flushed, or until ctx is done.
func (l *Log) Flush(ctx context.Context) error {
	l.init()
	if l.queues == nil {
		return nil
	}
	l.idleMu.Lock()
	if l.sinkPending.Load() == 0 {
		l.idleMu.Unlock()
		return nil
	}
	idle := make(chan struct{})
	l.idleWaiters = append(l.idleWaiters, idle)
	l.idleMu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("egresslog: flush: %w", ctx.Err())
	}
}

// JSONSink writes one JSON object per line (the form of Record.AppendJSON)
// to a writer or to a rotated file (JSONFile), buffered and written out
// when the Log's queue runs empty. A line is written whole.
type JSONSink struct {
	mu   sync.Mutex
	w    *bufio.Writer // the writer of NewJSONSink
	file *segmentFile  // or the file of JSONFile.Open
	buf  []byte
}

// NewJSONSink returns a sink writing JSON lines to w.
func NewJSONSink(w io.Writer) *JSONSink {
	return &JSONSink{w: bufio.NewWriterSize(w, 64<<10)}
}

// WriteRecord implements Sink.
func (s *JSONSink) WriteRecord(r *Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = r.AppendJSON(s.buf[:0])
	s.buf = append(s.buf, '\n')
	if s.file != nil {
		return s.file.writeLine(s.buf, 1)
	}
	_, err := s.w.Write(s.buf)
	return err
}

// appendGapLine appends the line that says n records are missing where
// it stands.
func appendGapLine(b []byte, n uint64) []byte {
	return fmt.Appendf(b, `{"dropped":%d,"time":%q}`+"\n", n, time.Now().UTC().Format(time.RFC3339Nano))
}

// WriteGap implements GapSink: a line that says n records are missing
// here.
func (s *JSONSink) WriteGap(n uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = appendGapLine(s.buf[:0], n)
	if s.file != nil {
		return s.file.writeLine(s.buf, n)
	}
	_, err := s.w.Write(s.buf)
	return err
}

// Flush implements Sink.
func (s *JSONSink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file != nil {
		return s.file.flush()
	}
	return s.w.Flush()
}

// Close flushes, and closes the file if the sink opened it. A Log closes
// its sinks itself; closing again does nothing.
func (s *JSONSink) Close() error {
	if s.file == nil {
		return s.Flush()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file.close()
}

// SlogSink writes each record as one log/slog line at Info (allowed) or
// Warn (denied) level.
type SlogSink struct {
	Logger *slog.Logger // nil means slog.Default()
}

// WriteRecord implements Sink.
func (s SlogSink) WriteRecord(r *Record) error {
	lg := s.Logger
	if lg == nil {
		lg = slog.Default()
	}
	level, msg := slog.LevelInfo, "egress allowed"
	if !r.Allowed || r.Report {
		level, msg = slog.LevelWarn, "egress denied"
	}
	attrs := []slog.Attr{
		slog.String(FieldAgent, r.Agent),
		slog.String(FieldKind, string(r.Kind)),
		slog.String(FieldHost, r.Host),
		slog.Int(FieldPort, int(r.Port)),
		slog.Bool(FieldAllowed, r.Allowed),
	}
	add := func(key, v string) {
		if v != "" {
			attrs = append(attrs, slog.String(key, v))
		}
	}
	add(FieldMethod, r.Method)
	add(FieldPath, r.Path)
	add(FieldReason, r.Reason)
	add(FieldRule, r.Rule)
	add(FieldSecret, r.Secret)
	if r.Addr.IsValid() {
		attrs = append(attrs, slog.String(FieldAddr, r.Addr.String()))
	}
	if r.Report {
		attrs = append(attrs, slog.Bool(FieldReport, true))
	}
	if r.Status != 0 {
		attrs = append(attrs, slog.Int(FieldStatus, r.Status))
	}
	if r.BytesUp != 0 || r.BytesDown != 0 {
		attrs = append(attrs, slog.Int64(FieldBytesUp, r.BytesUp), slog.Int64(FieldBytesDown, r.BytesDown))
	}
	if r.Duration != 0 {
		attrs = append(attrs, slog.Duration("duration", r.Duration.Round(time.Microsecond)))
	}
	if r.Count > 1 {
		attrs = append(attrs, slog.Uint64(FieldCount, r.Count))
	}
	lg.LogAttrs(context.Background(), level, msg, attrs...)
	return nil
}

// Flush implements Sink.
func (SlogSink) Flush() error { return nil }
