package policy

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// requestUse is what was seen of one request entry to suggest: a host,
// a port (0 for 80 and 443, which an entry without a port covers) and a
// path pattern, with the methods used on it.
type requestUse struct {
	host        string
	port        uint16
	pattern     string
	methods     map[string]bool
	count       int
	first, last time.Time
}

// suggestRequests takes the HTTP requests among obs that succeeded on
// names out of used and returns request entries for them: one per host,
// port and path (each ID-like segment a "*" when collapseIDs), with the
// methods used on it. A name they cover leaves used on the ports they
// cover (80 and 443 together), which its request entries allow; other
// ports stay.
func suggestRequests(obs []Observation, used map[string]*hostUse, collapseIDs bool) []SuggestedEntry {
	uses := map[string]*requestUse{}
	covered := map[string]map[uint16]bool{} // name -> ports its requests cover
	for _, o := range obs {
		if !o.Succeeded || o.Method == "" {
			continue
		}
		name, isName, ok := suggestionHost(o.Host)
		if !ok || !isName || used[name] == nil {
			continue
		}
		pattern, ok := pathPattern(o.Path, collapseIDs)
		if !ok {
			continue // a path no entry could allow: the requests stay covered by the host's entry
		}
		port := o.Port
		if port == 80 || port == 443 {
			port = 0
		}
		if covered[name] == nil {
			covered[name] = map[uint16]bool{}
		}
		covered[name][port] = true
		key := fmt.Sprintf("%s:%d%s", name, port, pattern)
		u := uses[key]
		if u == nil {
			u = &requestUse{host: name, port: port, pattern: pattern, methods: map[string]bool{}, first: o.Time, last: o.Time}
			uses[key] = u
		}
		u.methods[o.Method] = true
		u.count++
		u.first, u.last = minTime(u.first, o.Time), maxTime(u.last, o.Time)
	}
	for name, ports := range covered {
		u := used[name]
		for p := range ports {
			if p == 0 {
				delete(u.ports, 80)
				delete(u.ports, 443)
			}
			delete(u.ports, p)
		}
		delete(u.ports, 0) // resolving it is allowed by its request entries
		if len(u.ports) == 0 {
			delete(used, name)
		}
	}
	var out []SuggestedEntry
	for _, u := range uses {
		host := u.host
		if u.port != 0 {
			host = fmt.Sprintf("%s:%d", host, u.port)
		}
		out = append(out, SuggestedEntry{Entry: methodList(u.methods) + " " + host + u.pattern, Count: u.count, FirstSeen: u.first, LastSeen: u.last})
	}
	return out
}

// pathPattern is the request entry's pattern for a recorded path: its
// segments as a server reads them, escaped, each ID-like one a "*" when
// collapseIDs. ok is false for a path that does not normalise.
func pathPattern(path string, collapseIDs bool) (string, bool) {
	segs, why := appendPath(nil, path)
	if why != "" {
		return "", false
	}
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		if collapseIDs && looksLikeID(s) {
			b.WriteByte('*')
			continue
		}
		// "*" would be a wildcard in a pattern.
		b.WriteString(strings.ReplaceAll(url.PathEscape(s), "*", "%2A"))
	}
	if b.Len() == 0 {
		return "/", true
	}
	return b.String(), true
}

// looksLikeID reports whether a path segment is an identifier rather
// than a name: a number, a UUID, or a long token of letters and digits
// with a digit in it (a hash, an opaque ID).
func looksLikeID(s string) bool {
	digits, alnum := 0, 0
	for _, c := range s {
		switch {
		case '0' <= c && c <= '9':
			digits++
			alnum++
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
			alnum++
		}
	}
	switch {
	case digits == len(s):
		return true
	case len(s) == 36 && strings.Count(s, "-") == 4 && alnum == 32:
		return true // a UUID
	}
	return len(s) >= 16 && alnum == len(s) && digits > 0
}

// methodList is a set of methods as an entry writes it: the usual ones
// in their usual order, then the others sorted.
func methodList(methods map[string]bool) string {
	var out, others []string
	for _, m := range knownMethods {
		if methods[m] {
			out = append(out, m)
		}
	}
	for m := range methods {
		if methodBit(m) == 0 {
			others = append(others, m)
		}
	}
	slices.Sort(others)
	return strings.Join(append(out, others...), ",")
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
