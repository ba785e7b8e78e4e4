package egresslog

import (
	"cmp"
	"slices"
	"time"
)

// This file holds the bounds that Log.add applies to every record: the
// rings an agent's records are kept in, and the folding of refusals
// beyond an agent's burst into summaries.

// minRingCap is the first allocation of a ring: an agent that records
// little costs little.
const minRingCap = 16

// ring keeps the newest records pushed into it, at most keep of them. It
// grows as records arrive, so an idle agent's ring costs nothing.
type ring struct {
	recs []Record // grows to keep, then wraps
	next int      // once full, where the next record goes: the oldest
}

// push keeps r, evicting the oldest record if the ring holds keep.
func (g *ring) push(r *Record, keep int) {
	n := len(g.recs)
	switch {
	case n < keep && g.next == 0:
		if n == cap(g.recs) {
			grown := make([]Record, n, min(keep, max(minRingCap, 2*n)))
			copy(grown, g.recs)
			g.recs = grown
		}
		g.recs = append(g.recs, *r)
		return
	case n != keep: // the bound changed after the ring wrapped
		all := g.appendMatching(nil, &Filter{})
		if len(all) >= keep {
			all = all[len(all)-keep+1:]
		}
		g.recs = append(make([]Record, 0, keep), all...)
		g.recs = append(g.recs, *r)
		g.next = 0
		return
	}
	g.recs[g.next] = *r
	g.next = (g.next + 1) % keep
}

// appendMatching appends the records that f selects, oldest first.
func (g *ring) appendMatching(out []Record, f *Filter) []Record {
	n := len(g.recs)
	for i := range n {
		if r := &g.recs[(g.next+i)%n]; f.Match(r) {
			out = append(out, *r)
		}
	}
	return out
}

// appendNewest appends the newest limit records that f selects, oldest
// first: what a listing with a limit needs of each ring, without copying
// the rest.
func (g *ring) appendNewest(out []Record, f *Filter, limit int) []Record {
	n, start := len(g.recs), len(out)
	for i := n - 1; i >= 0 && len(out)-start < limit; i-- {
		if r := &g.recs[(g.next+i)%n]; f.Match(r) {
			out = append(out, *r)
		}
	}
	slices.Reverse(out[start:])
	return out
}

// denied reports whether r is a denied record in the sense of
// Filter.DeniedOnly: refused, or allowed only by report mode.
func (r *Record) denied() bool { return !r.Allowed || r.Report }

// refused reports whether r was refused: a record DenialBurst applies to.
// Report-mode records are allowed traffic, and never folded.
func (r *Record) refused() bool { return !r.Allowed && !r.Report }

// foldKey is what refusals are folded by, within one agent.
type foldKey struct {
	kind   Kind
	reason string
}

// fold is an agent's refusals of one kind and reason in one second.
type fold struct {
	sec   int64  // unix second
	n     int    // refusals in it
	count uint64 // those beyond the burst: folded
	first Record // the first folded refusal
}

// summary is the record that stands for f's folded refusals: the refusal
// itself if there is only one.
func (f *fold) summary(agent string, k foldKey) Record {
	if f.count == 1 {
		return f.first
	}
	return Record{
		Time: time.Unix(f.sec, 0), Agent: agent, Kind: k.kind, Host: f.first.Host,
		Allowed: false, Reason: k.reason, Count: f.count,
	}
}

// foldKey returns the key r's refusal is folded under: its kind and
// reason, or, once the agent has maxFoldKeys of them in the current
// second, its kind and OtherReason, or, beyond that, OtherReason alone. A
// hostile agent can provoke any number of reasons; it cannot make the
// state grow past maxFoldKeys+maxFoldKinds+1 keys.
func (a *agentLog) foldKey(r *Record) foldKey {
	k := foldKey{r.Kind, r.Reason}
	if _, ok := a.folds[k]; ok || len(a.folds) < maxFoldKeys {
		return k
	}
	k.reason = OtherReason
	if _, ok := a.folds[k]; ok || len(a.folds) < maxFoldKeys+maxFoldKinds {
		return k
	}
	return foldKey{reason: OtherReason}
}

// armLocked starts the timer that emits summaries when the current second
// is over, unless it runs already. pubMu is held.
func (l *Log) armLocked(now time.Time) {
	if l.foldTimer != nil || l.closed.Load() {
		return
	}
	l.foldTimer = l.clk().AfterFunc(time.Second-time.Duration(now.Nanosecond()), l.sweep)
}

// sweep runs when a second is over: it emits the summaries of the seconds
// that are over and forgets them, and runs again while refusals are
// tracked.
func (l *Log) sweep() {
	l.pubMu.Lock()
	defer l.pubMu.Unlock()
	l.foldTimer = nil
	if l.closed.Load() {
		return // Shutdown emitted them
	}
	now := l.clk().Now()
	l.emitFoldsLocked(now.Unix(), false)
	if len(l.folding) > 0 {
		l.armLocked(now)
	}
}

// emitFoldsLocked emits the summaries of every second but sec (of every
// second, if all) and forgets those seconds. pubMu is held.
func (l *Log) emitFoldsLocked(sec int64, all bool) {
	for a := range l.folding {
		a.mu.Lock()
		due := l.due[:0]
		for k, f := range a.folds {
			if f.sec == sec && !all {
				continue
			}
			if f.count > 0 {
				due = append(due, f.summary(a.name, k))
			}
			delete(a.folds, k)
		}
		slices.SortFunc(due, func(x, y Record) int {
			return cmp.Or(x.Time.Compare(y.Time), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Reason, y.Reason))
		})
		for i := range due {
			l.keepLocked(a, &due[i])
		}
		if len(a.folds) == 0 {
			a.folds = nil
			delete(l.folding, a)
		}
		a.mu.Unlock()
		for i := range due {
			l.publishLocked(&due[i])
		}
		clear(due)
		l.due = due[:0]
	}
}

// clock is a Log's time: tests replace it to step through seconds.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) stopper
}

// stopper stops a timer, as *time.Timer does.
type stopper interface{ Stop() bool }

type realClock struct{}

func (realClock) Now() time.Time                              { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }
