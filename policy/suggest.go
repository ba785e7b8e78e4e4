package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/agenthold/egress/internal/hostname"
	"github.com/agenthold/egress/netguard"
)

// Observation is one use of the network by an agent, as its log records
// it: a DNS query (Port 0) or a connection or request.
type Observation struct {
	Host string // a name or an address, as recorded
	Port uint16 // 0 for a DNS query
	Time time.Time
	// Succeeded is set when the use was carried out (allowed, or allowed
	// in report mode, and not failed upstream); the rest were only
	// attempted.
	Succeeded bool
	// Method and Path are an HTTP request's (plain, or intercepted), for
	// suggesting request entries.
	Method, Path string
}

// SuggestConfig tunes Suggest.
type SuggestConfig struct {
	// Collapse, when positive, replaces Collapse or more names under one
	// parent by a wildcard for the parent ("*.npmjs.org"), where the
	// parent is not a public suffix. Zero never collapses; nothing ever
	// becomes "*".
	Collapse int
	// Requests proposes request entries ("GET,POST api.example.com/v1/x")
	// for the hosts whose requests were seen, instead of entries for the
	// whole host; CollapseIDs then writes ID-like path segments (numbers,
	// UUIDs, long tokens with digits) as "*". Hosts only connected to keep
	// host entries.
	Requests    bool
	CollapseIDs bool
}

// SuggestedEntry is an entry of a suggestion, with what supports it.
type SuggestedEntry struct {
	Entry     string
	Count     int
	FirstSeen time.Time
	LastSeen  time.Time
}

// Suggestion is the smallest allowlist that covers what an agent did.
type Suggestion struct {
	Document Document // enforce: true, an allowlist of Used
	// Used are the entries of Document; Attempted what was only tried
	// (denied, or failed upstream), which Document leaves out.
	Used, Attempted []SuggestedEntry
}

// Suggest proposes an allowlist from what an agent did, typically in
// report mode. It never proposes a DNS side door (a public DNS-over-HTTPS
// resolver, port 853), nor a wildcard over a public suffix, a platform's
// shared suffix, or "*": those are attempted, left out. Otherwise: every name and address it reached, on the ports it used
// (80 and 443 make a bare entry); a name it only resolved, and connected
// to no port of, gets a bare entry too. Invalid hosts are skipped.
func Suggest(obs []Observation, cfg SuggestConfig) Suggestion {
	used, attempted := map[string]*hostUse{}, map[string]*hostUse{}
	for _, o := range obs {
		key, isName, ok := suggestionHost(o.Host)
		if !ok {
			continue
		}
		uses := attempted
		if o.Succeeded {
			uses = used
		}
		u := uses[key]
		if u == nil {
			u = &hostUse{host: key, name: isName, ports: map[uint16]bool{}, first: o.Time, last: o.Time}
			uses[key] = u
		}
		u.add(o)
	}
	// A DNS resolver reached around the gateway's DNS: only an operator's
	// deliberate entry may allow it, never a learnt one.
	sideDoors := map[string]bool{}
	for key, u := range used {
		switch {
		case knownResolver(key):
			delete(used, key)
		case u.ports[dotPort]:
			delete(u.ports, dotPort)
			if len(u.ports) == 0 {
				delete(used, key)
			}
			u = &hostUse{host: u.host, name: u.name, ports: map[uint16]bool{dotPort: true}, count: u.count, first: u.first, last: u.last}
		default:
			continue
		}
		if a := attempted[key]; a != nil {
			u.merge(a)
		}
		attempted[key] = u
		sideDoors[key] = true
	}
	for key := range attempted {
		if used[key] != nil && !sideDoors[key] {
			delete(attempted, key) // it worked at least once
		}
	}
	var requests []SuggestedEntry
	if cfg.Requests {
		requests = suggestRequests(obs, used, cfg.CollapseIDs)
	}
	if cfg.Collapse > 0 {
		collapse(used, cfg.Collapse)
	}
	s := Suggestion{Used: append(entries(used), requests...), Attempted: entries(attempted)}
	slices.SortFunc(s.Used, func(a, b SuggestedEntry) int { return strings.Compare(a.Entry, b.Entry) })
	enforce := true
	s.Document = Document{Enforce: &enforce, Mode: "allowlist"}
	for _, e := range s.Used {
		s.Document.Allow = append(s.Document.Allow, e.Entry)
	}
	return s
}

// knownResolver reports whether host is a built-in DNS-over-HTTPS
// resolver's name or address, or a subdomain of one's name.
func knownResolver(host string) bool {
	for h := host; ; {
		if slices.Contains(knownDoH, h) {
			return true
		}
		_, rest, ok := strings.Cut(h, ".")
		if !ok {
			return false
		}
		h = rest
	}
}

// hostUse is what was seen of one host (or, collapsed, one wildcard).
type hostUse struct {
	host        string
	name        bool
	ports       map[uint16]bool // 0: resolved
	count       int
	first, last time.Time
}

func (u *hostUse) add(o Observation) {
	u.ports[o.Port] = true
	u.count++
	if o.Time.Before(u.first) {
		u.first = o.Time
	}
	if o.Time.After(u.last) {
		u.last = o.Time
	}
}

func (u *hostUse) merge(o *hostUse) {
	for p := range o.ports {
		u.ports[p] = true
	}
	u.count += o.count
	if o.first.Before(u.first) {
		u.first = o.first
	}
	if o.last.After(u.last) {
		u.last = o.last
	}
}

// suggestionHost is the canonical form of a recorded host: a name, or an
// address.
func suggestionHost(host string) (string, bool, bool) {
	if a, err := netguard.ParseLiteral(host); err == nil {
		return a.WithZone("").Unmap().String(), false, true
	} else if !errors.Is(err, netguard.ErrNotLiteral) {
		return "", false, false
	}
	name, err := NormalizeName(host)
	return name, true, err == nil
}

// collapse replaces, among names, every group of at least n siblings
// (names one label under the same parent) by the parent's wildcard.
func collapse(uses map[string]*hostUse, n int) {
	siblings := map[string][]string{}
	for key, u := range uses {
		if _, parent, ok := strings.Cut(key, "."); ok && u.name {
			siblings[parent] = append(siblings[parent], key)
		}
	}
	for parent, names := range siblings {
		if len(names) < n {
			continue
		}
		wild := "*." + parent
		if _, err := hostname.ParsePattern(wild); err != nil {
			continue // over a public suffix: never collapsed
		}
		if ps, _ := publicsuffix.PublicSuffix(parent); ps == parent {
			continue // nor over a platform's (workers.dev, s3.amazonaws.com): its names are anyone's
		}
		w := &hostUse{host: wild, name: true, ports: map[uint16]bool{}, first: uses[names[0]].first, last: uses[names[0]].last}
		for _, name := range names {
			w.merge(uses[name])
			delete(uses, name)
		}
		uses[wild] = w
	}
}

// entries turns uses into allow entries, sorted: a bare entry for ports 80
// and 443 (or a name only resolved), one entry per other port.
func entries(uses map[string]*hostUse) []SuggestedEntry {
	var out []SuggestedEntry
	for _, u := range uses {
		host := u.host
		if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
			host = "[" + host + "]"
		}
		// A name only resolved makes a bare entry; one also connected to
		// is covered by the entries of its ports, each of which lets it
		// resolve.
		bare := len(u.ports) == 1 && u.ports[0]
		var others []uint16
		for p := range u.ports {
			switch p {
			case 0:
			case 80, 443:
				bare = true
			default:
				others = append(others, p)
			}
		}
		slices.Sort(others)
		add := func(entry string) {
			out = append(out, SuggestedEntry{Entry: entry, Count: u.count, FirstSeen: u.first, LastSeen: u.last})
		}
		if bare {
			if strings.HasPrefix(host, "[") {
				add(u.host) // a bare IPv6 address takes no brackets
			} else {
				add(host)
			}
		}
		for _, p := range others {
			add(fmt.Sprintf("%s:%d", host, p))
		}
	}
	slices.SortFunc(out, func(a, b SuggestedEntry) int { return strings.Compare(a.Entry, b.Entry) })
	return out
}
