package egresslog

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for a Log's zero fields.
const (
	DefaultKeep        = 5000 // allowed records kept per agent (the seed's log_keep), and denied ones
	DefaultDenialBurst = 10   // refusals recorded one by one per agent, kind and reason in a second
	DefaultMaxAgents   = 4096
	DefaultSinkQueue   = 8192
	DefaultFollowBuf   = 256
	maxReasonKeys      = 64 // distinct denial reasons counted per agent
	maxFoldKeys        = 32 // distinct kinds and reasons of refusal tracked per agent in a second
	maxFoldKinds       = 8  // catch-all keys (one per kind) tracked beyond maxFoldKeys
)

// OtherReason is the reason under which an agent's refusals are counted
// (Stats) and summarised (Log.DenialBurst) beyond the bound on distinct
// reasons: an agent can provoke any number of reasons.
const OtherReason = "other"

// Log keeps the newest records of each agent in bounded rings, lets
// readers list and follow them, counts them, and hands each record to the
// sinks. The zero Log is ready to use; set its fields before the first
// record. Recording never blocks on a reader or a sink: a slow follower
// loses records and is told how many, a slow or failing sink loses records
// and the Log counts them.
//
// Every record passes through one bounding step before it is kept,
// followed or written (see the package doc): an agent's allowed and
// denied records are kept in separate rings, so that allowed traffic
// never evicts a denial, and refusals beyond DenialBurst a second are
// folded into one summary record.
type Log struct {
	// Keep is the number of allowed records kept per agent; zero means
	// DefaultKeep. Denied records are kept apart (KeepDenied).
	Keep int
	// KeepDenied is the number of denied records (Allowed false, or
	// Report) kept per agent, apart from the allowed ones so that allowed
	// traffic cannot evict them; zero means DefaultKeep.
	KeepDenied int
	// DenialBurst is the number of refusals (Allowed false and not Report)
	// of one agent, kind and reason recorded one by one in a wall-clock
	// second; the rest of that second are folded into one summary record
	// emitted when the second is over (by a timer), or by Shutdown. A
	// summary has the agent, kind and reason, Allowed false, Count (how
	// many refusals it stands for, at least 2), Time the start of the
	// second, and Host the first folded refusal's; a single folded refusal
	// is emitted as it was. Stats count every refusal. Beyond 32 distinct
	// reasons of an agent in a second, its refusals fold under OtherReason
	// (per kind, for 8 kinds; then all kinds together). Zero means
	// DefaultDenialBurst; report-mode and allowed records are never
	// folded.
	DenialBurst int
	// MaxAgents bounds the number of agents held; when a new agent would
	// exceed it, the agent written least recently is dropped. Zero means
	// DefaultMaxAgents.
	MaxAgents int
	// Sinks receive every record, in order, from one goroutine. The Log
	// owns them: when that goroutine ends (after Shutdown or Close, once
	// the queue is written out) it closes each sink that is an io.Closer.
	Sinks []Sink
	// SinkQueue is the number of records waiting for the sinks before new
	// ones are dropped; zero means DefaultSinkQueue.
	SinkQueue int
	// CountedReasons are denial reasons Stats always counts under their
	// own name. Other reasons share a bound of 64 distinct ones per agent,
	// beyond which they count as "other": an agent can provoke any number
	// of them, and must not hide the ones an operator watches.
	CountedReasons []string

	clock clock // nil means the real one; set by tests

	initOnce sync.Once
	counted  map[string]bool
	seq      atomic.Uint64
	openID   atomic.Uint64

	mu     sync.RWMutex // guards agents
	agents map[string]*agentLog

	pubMu     sync.Mutex // guards followers, folding and foldTimer; orders publication
	followers map[*Follower]struct{}
	folding   map[*agentLog]struct{} // agents with refusals tracked (agentLog.folds)
	foldTimer stopper                // emits the summaries of a second once it is over
	due       []Record               // summaries being emitted, reused

	queues      []*sinkQueue // one per sink
	sinkPending atomic.Int64 // queued or being written, over all queues
	idleMu      sync.Mutex   // orders the last decrement of sinkPending with Flush
	idleWaiters []chan struct{}
	sinkDone    chan struct{}
	sinkDropped atomic.Uint64
	sinkErrors  atomic.Uint64
	closeOnce   sync.Once
	closed      atomic.Bool
}

// agentLog is one agent's rings, open connections and counters.
type agentLog struct {
	name      string
	mu        sync.Mutex
	allowed   ring // allowed records
	denied    ring // denied and report-mode records, summaries of refusals
	open      map[uint64]Record
	stats     Stats
	folds     map[foldKey]fold // refusals in the current second; nil when none
	lastWrite atomic.Int64     // unix nanoseconds, for eviction
}

func (l *Log) init() {
	l.initOnce.Do(func() {
		l.agents = map[string]*agentLog{}
		l.counted = map[string]bool{}
		for _, r := range l.CountedReasons {
			l.counted[r] = true
		}
		l.followers = map[*Follower]struct{}{}
		l.folding = map[*agentLog]struct{}{}
		if len(l.Sinks) > 0 {
			n := l.SinkQueue
			if n <= 0 {
				n = DefaultSinkQueue
			}
			l.sinkDone = make(chan struct{})
			var wg sync.WaitGroup
			for _, sink := range l.Sinks {
				q := &sinkQueue{sink: sink, ch: make(chan queued, n)}
				l.queues = append(l.queues, q)
				wg.Go(func() { l.drain(q) })
			}
			go func() {
				wg.Wait()
				close(l.sinkDone)
			}()
		}
	})
}

func (l *Log) keep() int {
	if l.Keep > 0 {
		return l.Keep
	}
	return DefaultKeep
}

func (l *Log) keepDenied() int {
	if l.KeepDenied > 0 {
		return l.KeepDenied
	}
	return DefaultKeep
}

func (l *Log) denialBurst() int {
	if l.DenialBurst > 0 {
		return l.DenialBurst
	}
	return DefaultDenialBurst
}

func (l *Log) clk() clock {
	if l.clock != nil {
		return l.clock
	}
	return realClock{}
}

func (l *Log) maxAgents() int {
	if l.MaxAgents > 0 {
		return l.MaxAgents
	}
	return DefaultMaxAgents
}

// agent returns the log of an agent, creating it (and evicting the least
// recently written agent if there are too many).
func (l *Log) agent(name string) *agentLog {
	l.mu.RLock()
	a := l.agents[name]
	l.mu.RUnlock()
	if a != nil {
		return a
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if a = l.agents[name]; a != nil {
		return a
	}
	if len(l.agents) >= l.maxAgents() {
		var oldest string
		oldestT := int64(1<<63 - 1)
		for n, al := range l.agents {
			if t := al.lastWrite.Load(); t < oldestT {
				oldest, oldestT = n, t
			}
		}
		delete(l.agents, oldest)
	}
	a = &agentLog{name: name, open: map[uint64]Record{}, stats: Stats{DeniedByReason: map[string]uint64{}}}
	l.agents[name] = a
	return a
}

// Record adds a finished record: to its agent's rings, to the counters,
// to matching followers and to the sinks, unless it is a refusal beyond
// DenialBurst, which is counted and folded into a summary. A zero Time
// means now. Strings are bounded and the query string is dropped from
// Path.
func (l *Log) Record(r Record) {
	l.init()
	if r.Time.IsZero() {
		r.Time = l.clk().Now()
	}
	r.sanitize()
	r.Open = false
	r.Count = 0
	l.add(r)
}

// add is the one place every record passes (Record and Conn.End): it
// counts the record, folds refusals beyond the agent's burst, and keeps,
// follows and queues for the sinks what remains.
func (l *Log) add(r Record) {
	a := l.agent(r.Agent)
	a.lastWrite.Store(r.Time.UnixNano())
	// pubMu orders sequence numbers, follower deliveries and the sink
	// queue alike, and, taken in Close, orders any send before the queue
	// closes.
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	a.mu.Lock()
	a.stats.add(&r, l.counted)
	var due Record // the summary of an earlier second, if one is due now
	hasDue := false
	if r.refused() && !l.closed.Load() {
		now := l.clk().Now()
		sec := now.Unix()
		k := a.foldKey(&r)
		f, ok := a.folds[k]
		if !ok || f.sec != sec {
			if ok && f.count > 0 {
				due, hasDue = f.summary(a.name, k), true
				l.keepLocked(a, &due)
			}
			if a.folds == nil {
				a.folds = make(map[foldKey]fold)
				l.folding[a] = struct{}{}
				l.armLocked(now)
			}
			f = fold{sec: sec}
		}
		f.n++
		if f.n > l.denialBurst() {
			if f.count++; f.count == 1 {
				f.first = r
			}
			a.folds[k] = f
			a.mu.Unlock()
			if hasDue {
				l.publishLocked(&due)
			}
			return
		}
		a.folds[k] = f
	}
	l.keepLocked(a, &r)
	a.mu.Unlock()
	if hasDue {
		l.publishLocked(&due)
	}
	l.publishLocked(&r)
}

// keepLocked numbers a record and keeps it in its agent's ring. pubMu and
// a.mu are held.
func (l *Log) keepLocked(a *agentLog, r *Record) {
	r.Seq = l.seq.Add(1)
	if r.denied() {
		a.denied.push(r, l.keepDenied())
	} else {
		a.allowed.push(r, l.keep())
	}
}

// publishLocked hands a kept record to the followers and the sinks. pubMu
// is held.
func (l *Log) publishLocked(r *Record) {
	for f := range l.followers {
		f.offer(r)
	}
	if l.closed.Load() {
		return
	}
	for _, q := range l.queues {
		l.sinkPending.Add(1)
		select {
		case q.ch <- queued{r: *r, gap: q.dropped}:
			q.dropped = 0
		default:
			l.doneWith()
			l.sinkDropped.Add(1)
			q.dropped++
		}
	}
}

// Conn is a connection that is still open; End records it.
type Conn struct {
	l     *Log
	a     *agentLog
	id    uint64
	start time.Time
	once  sync.Once
}

// Begin registers an open connection, visible through OpenConns until End
// is called.
func (l *Log) Begin(r Record) *Conn {
	l.init()
	if r.Time.IsZero() {
		r.Time = l.clk().Now()
	}
	r.sanitize()
	r.Open = true
	c := &Conn{l: l, a: l.agent(r.Agent), id: l.openID.Add(1), start: r.Time}
	r.ConnID = c.id
	c.a.mu.Lock()
	c.a.open[c.id] = r
	c.a.mu.Unlock()
	return c
}

// ID identifies the connection: its records, and those of the HTTP
// requests it carries, have it as their ConnID.
func (c *Conn) ID() uint64 { return c.id }

// End records the connection as closed, with the final record r: its Time
// is the connection's start, and a zero Duration is the time since Begin.
// Calls after the first do nothing.
func (c *Conn) End(r Record) {
	c.once.Do(func() {
		c.a.mu.Lock()
		delete(c.a.open, c.id)
		c.a.mu.Unlock()
		r.Time, r.ConnID = c.start, c.id
		if r.Duration == 0 {
			r.Duration = c.l.clk().Now().Sub(c.start)
		}
		r.sanitize()
		r.Open = false
		r.Count = 0
		c.l.add(r)
	})
}

// OpenConns lists an agent's open connections ("" for all agents), oldest
// first.
func (l *Log) OpenConns(agent string) []Record {
	l.init()
	var out []Record
	for _, a := range l.agentsFor(agent) {
		a.mu.Lock()
		for _, r := range a.open {
			out = append(out, r)
		}
		a.mu.Unlock()
	}
	slices.SortFunc(out, func(x, y Record) int { return x.Time.Compare(y.Time) })
	return out
}

func (l *Log) agentsFor(agent string) []*agentLog {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if agent != "" {
		if a := l.agents[agent]; a != nil {
			return []*agentLog{a}
		}
		return nil
	}
	out := make([]*agentLog, 0, len(l.agents))
	for _, a := range l.agents {
		out = append(out, a)
	}
	return out
}

// Filter selects records. The zero Filter selects all.
type Filter struct {
	Agent      string    // one agent; "" means all
	Kind       Kind      // one kind; "" means all
	DeniedOnly bool      // only denied records (report-mode records count as denied)
	Since      time.Time // only records at or after this time
}

// Match reports whether the filter selects r.
func (f *Filter) Match(r *Record) bool {
	return (f.Agent == "" || r.Agent == f.Agent) &&
		(f.Kind == "" || r.Kind == f.Kind) &&
		(!f.DeniedOnly || !r.Allowed || r.Report) &&
		(f.Since.IsZero() || !r.Time.Before(f.Since))
}

// List returns the newest records that match f, at most limit of them
// (zero means all that are kept), oldest first: an agent's allowed and
// denied records merged in Seq order.
func (l *Log) List(f Filter, limit int) []Record {
	l.init()
	var out []Record
	take := func(g *ring) {
		if limit > 0 {
			out = g.appendNewest(out, &f, limit) // no more of a ring can be among the newest limit
		} else {
			out = g.appendMatching(out, &f)
		}
	}
	for _, a := range l.agentsFor(f.Agent) {
		a.mu.Lock()
		if !f.DeniedOnly {
			take(&a.allowed)
		}
		take(&a.denied)
		a.mu.Unlock()
	}
	slices.SortFunc(out, func(x, y Record) int {
		switch {
		case x.Seq < y.Seq:
			return -1
		case x.Seq > y.Seq:
			return 1
		}
		return 0
	})
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

// Agents lists the agents that have records, in no order.
func (l *Log) Agents() []string {
	l.init()
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]string, 0, len(l.agents))
	for n := range l.agents {
		out = append(out, n)
	}
	return out
}

// Forget drops an agent's records, open connections and counters. A
// summary of its refusals still pending is emitted to the followers and
// sinks when its second is over.
func (l *Log) Forget(agent string) {
	l.init()
	l.mu.Lock()
	delete(l.agents, agent)
	l.mu.Unlock()
}

// Follower receives new records as they are recorded.
type Follower struct {
	C      <-chan Record // new matching records
	c      chan Record
	filter Filter
	lost   atomic.Uint64
	l      *Log
	once   sync.Once
	done   chan struct{}
}

// Follow returns a Follower of new records that match f, with a buffer of
// buf records (zero means DefaultFollowBuf). When the buffer is full, new
// records are dropped for this follower and counted in Lost. The follower
// stops when ctx is done or Close is called; C is then closed.
func (l *Log) Follow(ctx context.Context, f Filter, buf int) *Follower {
	l.init()
	if buf <= 0 {
		buf = DefaultFollowBuf
	}
	c := make(chan Record, buf)
	fl := &Follower{C: c, c: c, filter: f, l: l, done: make(chan struct{})}
	l.pubMu.Lock()
	l.followers[fl] = struct{}{}
	l.pubMu.Unlock()
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				fl.Close()
			case <-fl.done:
			}
		}()
	}
	return fl
}

func (f *Follower) offer(r *Record) {
	if !f.filter.Match(r) {
		return
	}
	select {
	case f.c <- *r:
	default:
		f.lost.Add(1)
	}
}

// Lost reports how many matching records were dropped because the
// follower did not keep up.
func (f *Follower) Lost() uint64 { return f.lost.Load() }

// Close stops the follower and closes C.
func (f *Follower) Close() {
	f.once.Do(func() {
		f.l.pubMu.Lock()
		delete(f.l.followers, f)
		close(f.c)
		f.l.pubMu.Unlock()
		close(f.done)
	})
}
