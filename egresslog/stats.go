package egresslog

import "maps"

// Stats are an agent's counters since it was first recorded, for a
// metrics exporter. They count every record exactly, the refusals folded
// into a summary (Log.DenialBurst) included; a summary itself is not
// counted again.
type Stats struct {
	Records        uint64            // records of every kind
	Denied         uint64            // denied records (report-mode ones included)
	DeniedByReason map[string]uint64 // denials by reason; at most 64 reasons besides Log.CountedReasons, the rest under OtherReason
	Injected       uint64            // requests that carried an injected secret
	BytesUp        uint64            // agent towards destinations
	BytesDown      uint64            // destinations back to the agent
}

func (s *Stats) add(r *Record, counted map[string]bool) {
	s.Records++
	if !r.Allowed || r.Report {
		s.Denied++
		reason := r.Reason
		if _, ok := s.DeniedByReason[reason]; !ok && !counted[reason] && s.uncounted(counted) >= maxReasonKeys {
			reason = OtherReason
		}
		s.DeniedByReason[reason]++
	}
	if r.Secret != "" {
		s.Injected++
	}
	if r.Kind == KindHTTP && r.ConnID != 0 {
		return // counted with the connection that carried it
	}
	if r.BytesUp > 0 {
		s.BytesUp += uint64(r.BytesUp)
	}
	if r.BytesDown > 0 {
		s.BytesDown += uint64(r.BytesDown)
	}
}

// uncounted is the number of distinct reasons held that are not among the
// counted ones.
func (s *Stats) uncounted(counted map[string]bool) int {
	n := len(s.DeniedByReason)
	for r := range counted {
		if _, ok := s.DeniedByReason[r]; ok {
			n--
		}
	}
	return n
}

// Stats returns a copy of each agent's counters.
func (l *Log) Stats() map[string]Stats {
	l.init()
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make(map[string]Stats, len(l.agents))
	for name, a := range l.agents {
		a.mu.Lock()
		s := a.stats
		s.DeniedByReason = maps.Clone(a.stats.DeniedByReason)
		a.mu.Unlock()
		out[name] = s
	}
	return out
}

// SinkStats reports how many records the sinks missed because their queue
// was full, and how many sink writes failed.
func (l *Log) SinkStats() (dropped, failed uint64) {
	return l.sinkDropped.Load(), l.sinkErrors.Load()
}
