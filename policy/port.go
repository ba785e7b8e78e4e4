package policy

import "slices"

// DecidePort answers whether any destination at all may be reached on
// port: a denial means that nothing a client could name (a server name, a
// Host, a resolved name) would be allowed there, so a connection to the
// port can be refused before its client says anything. Port 853 (DNS over
// TLS) counts only where an entry names it.
func (p *Policy) DecidePort(port uint16) Decision {
	if d, done := p.modeDecision(); done {
		return d
	}
	if port == dotPort {
		if !p.namedPorts.has(port) {
			return p.finish(Decision{Reason: ReasonDoT})
		}
		return Decision{Allowed: true, Reason: ReasonAllowedByRule}
	}
	if p.mode == Open {
		return Decision{Allowed: true, Reason: ReasonOpen}
	}
	if p.ask {
		return Decision{Allowed: true, Reason: ReasonAllowedByRule} // any port may be approved
	}
	if !p.allowedPorts.has(port) {
		return p.finish(Decision{Reason: ReasonPortNotListed})
	}
	return Decision{Allowed: true, Reason: ReasonAllowedByRule}
}

// portSet is a sorted list of disjoint port ranges.
type portSet []portRange

// add merges ranges into the set.
func (s portSet) add(ranges ...portRange) portSet {
	s = append(s, ranges...)
	slices.SortFunc(s, func(a, b portRange) int { return int(a.lo) - int(b.lo) })
	out := s[:0]
	for _, r := range s {
		if n := len(out); n > 0 && int(r.lo) <= int(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func (s portSet) has(port uint16) bool {
	i, found := slices.BinarySearchFunc(s, port, func(r portRange, p uint16) int {
		switch {
		case r.hi < p:
			return -1
		case r.lo > p:
			return 1
		}
		return 0
	})
	return found && i >= 0
}
