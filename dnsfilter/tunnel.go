package dnsfilter

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"
)

// DNS tunnelling carries data in the names looked up: every query to a
// zone its owner runs delivers the labels to the owner's name server, and
// the answers carry data back. A policy that allows the zone (open mode,
// a wide wildcard) cannot tell. What gives a tunnel away is volume: it
// needs many distinct names under one zone, made of labels that are new
// and dense in information. The detector counts, per agent and zone (the
// registrable domain, by the public suffix list), in a window: the
// distinct names, the distinct labels, and the information the distinct
// names carry. A new label costs its length times the Shannon entropy of
// its characters (at least what its length tells); a label seen before
// in the zone costs the bits it takes to choose it among the zone's labels
// so far (so that data spelt as an order of known labels costs too); a
// known name asked with a new query type costs a bit, and one asked
// again that goes to the name server (not answered from the cache) the
// bits it takes to choose it among the zone's names (so that data spelt
// as an order of lookups among a few names costs too). Beyond any bound,
// the agent's lookups under the zone are suspect for the rest of the
// window; beyond a bound on the information of all its zones together
// (a tunnel spread over many zones), all its lookups under any zone are.
//
// Ordinary zones stay far below: their names reuse a small vocabulary
// (services and regions, languages, shard numbers). A short secret leaked
// in one lookup is no volume, and is not seen; against that, the gateway
// keeps secrets out of the sandbox (vault placeholders).

// Defaults for a TunnelDetection's zero fields.
const (
	DefaultTunnelWindow    = 10 * time.Minute
	DefaultTunnelMaxNames  = 1000
	DefaultTunnelMaxLabels = 500
	// DefaultTunnelMaxBits is 1 KiB of information in a window: a busy
	// zone of ordinary names (every service of a cloud in every region)
	// carries a few kilobits; a tunnel moves that in a few dozen queries.
	DefaultTunnelMaxBits = 8192
	// DefaultTunnelZonesPerAgent bounds the zones tracked per agent;
	// beyond it, the zone whose names carried the least is forgotten.
	DefaultTunnelZonesPerAgent = 256
)

// ReasonTunnel begins the reason of a suspect lookup.
const ReasonTunnel = "suspected DNS tunnelling"

// TunnelDetection configures the detection of DNS tunnelling. Its zero
// value detects with the defaults and records suspect queries without
// refusing them.
type TunnelDetection struct {
	// Window is the span the counters cover; zero means
	// DefaultTunnelWindow.
	Window time.Duration
	// MaxNames and MaxLabels bound the distinct names, and the distinct
	// labels in them, an agent may look up under one zone in a window;
	// zero means DefaultTunnelMaxNames and DefaultTunnelMaxLabels.
	MaxNames, MaxLabels int
	// MaxBits is how much information (bits) those names may carry in a
	// window; zero means DefaultTunnelMaxBits.
	MaxBits float64
	// Refuse answers suspect queries REFUSED (and fails the gateway's
	// suspect lookups) instead of only recording them.
	Refuse bool
	// ZonesPerAgent bounds the zones tracked per agent; zero means
	// DefaultTunnelZonesPerAgent.
	ZonesPerAgent int
	// MaxAgentBits bounds the information an agent's names carry in a
	// window across all zones, so that a tunnel cannot spread over many
	// zones each under MaxBits; zero means 4 × MaxBits.
	MaxAgentBits float64
}

// tunnelDetector holds the counters of every agent.
type tunnelDetector struct {
	cfg    TunnelDetection
	agents sync.Map // agent -> *agentZones
}

func newTunnelDetector(cfg TunnelDetection) *tunnelDetector {
	cfg.Window = cmpDur(cfg.Window, DefaultTunnelWindow)
	cfg.MaxNames = cmp(cfg.MaxNames, DefaultTunnelMaxNames)
	cfg.MaxLabels = cmp(cfg.MaxLabels, DefaultTunnelMaxLabels)
	if !(cfg.MaxBits > 0) {
		cfg.MaxBits = DefaultTunnelMaxBits
	}
	cfg.ZonesPerAgent = cmp(cfg.ZonesPerAgent, DefaultTunnelZonesPerAgent)
	if !(cfg.MaxAgentBits > 0) {
		cfg.MaxAgentBits = 4 * cfg.MaxBits
	}
	return &tunnelDetector{cfg: cfg}
}

// agentZones is one agent's counters, by zone, and in all.
type agentZones struct {
	mu      sync.Mutex
	zones   map[string]*zoneCount
	start   time.Time // of the agent's window
	bits    float64   // carried in the agent's window, in all zones
	suspect bool      // over MaxAgentBits: every lookup under a zone is
}

// zoneCount is what an agent looked up under one zone in the current
// window.
type zoneCount struct {
	start   time.Time
	names   map[uint64]uint32   // hashes of the distinct names, and the query types asked of each; at most MaxNames+1
	labels  map[uint64]struct{} // hashes of the distinct labels; at most MaxLabels+1
	bits    float64
	suspect bool
}

// suspicion says whether looking up name makes agent's lookups under its
// zone suspect, and why; changed is set when this lookup made them so.
type suspicion struct {
	why     string
	changed bool
}

// observe counts a lookup of name (canonical, with or without the final
// dot) of type qtype by agent at now; upstream says it will reach the
// name server, not the cache.
func (d *tunnelDetector) observe(agent, name string, qtype uint16, upstream bool, now time.Time) suspicion {
	name = strings.TrimSuffix(name, ".")
	zone, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil || len(zone) >= len(name) {
		return suspicion{} // a public suffix or the zone itself: no label carries data
	}
	sub := name[:len(name)-len(zone)-1]
	v, ok := d.agents.Load(agent)
	if !ok {
		v, _ = d.agents.LoadOrStore(agent, &agentZones{zones: map[string]*zoneCount{}, start: now})
	}
	az := v.(*agentZones)
	az.mu.Lock()
	defer az.mu.Unlock()
	if now.Sub(az.start) >= d.cfg.Window {
		az.start, az.bits, az.suspect = now, 0, false
	}
	zc := az.zones[zone]
	if zc != nil && now.Sub(zc.start) >= d.cfg.Window {
		zc = nil // the window ended: count afresh
	}
	if zc == nil {
		if len(az.zones) >= d.cfg.ZonesPerAgent {
			az.makeRoom(now, d.cfg.Window, d.cfg.ZonesPerAgent)
		}
		zc = &zoneCount{start: now, names: map[uint64]uint32{}, labels: map[uint64]struct{}{}}
		az.zones[zone] = zc
	}
	if !zc.suspect && !az.suspect {
		before := zc.bits
		zc.count(sub, qtype, upstream, d.cfg)
		az.bits += zc.bits - before
	}
	switch {
	case zc.suspect:
		return suspicion{why: zc.reason(zone, d.cfg.Window)}
	case az.suspect:
		return suspicion{why: az.reason(d.cfg.Window)}
	case len(zc.names) > d.cfg.MaxNames || len(zc.labels) > d.cfg.MaxLabels || zc.bits > d.cfg.MaxBits:
		zc.suspect = true
		return suspicion{why: zc.reason(zone, d.cfg.Window), changed: true}
	case az.bits > d.cfg.MaxAgentBits:
		az.suspect = true
		return suspicion{why: az.reason(d.cfg.Window), changed: true}
	}
	return suspicion{}
}

func (az *agentZones) reason(window time.Duration) string {
	return fmt.Sprintf("%s: %.0f bits across %d zones within %v", ReasonTunnel, az.bits, len(az.zones), window)
}

// count adds sub (the labels under the zone), looked up with qtype, to
// the counters. A name seen before costs a bit with a new query type
// (which types were asked of a name could carry data too); with one it
// was asked before, nothing if the cache answers (the name server learns
// nothing), else what choosing it among the zone's names tells.
func (zc *zoneCount) count(sub string, qtype uint16, upstream bool, cfg TunnelDetection) {
	key := foldedHash(sub)
	types, seen := zc.names[key]
	bit := qtypeBit(qtype)
	if seen {
		switch {
		case types&bit == 0:
			zc.names[key] = types | bit
			zc.bits++
		case upstream:
			zc.bits += math.Log2(float64(max(len(zc.names), 2)))
		}
		return
	}
	zc.names[key] = bit
	for label := range strings.SplitSeq(sub, ".") {
		key := foldedHash(label)
		if _, seen := zc.labels[key]; seen {
			zc.bits += math.Log2(float64(max(len(zc.labels), 2)))
			continue
		}
		if len(zc.labels) > cfg.MaxLabels {
			return // suspect already
		}
		zc.labels[key] = struct{}{}
		// At least what its length could say: a label of one letter
		// repeated still tells its length.
		zc.bits += max(information(label), math.Log2(float64(len(label)+1)))
	}
}

func (zc *zoneCount) reason(zone string, window time.Duration) string {
	return fmt.Sprintf("%s: %d distinct names, %d distinct labels, %.0f bits under %s within %v", ReasonTunnel, len(zc.names), len(zc.labels), zc.bits, zone, window)
}

// makeRoom drops the zones whose window ended, and if none did, the zone
// whose names carried the least: a tunnel's zone, heavy with bits, is
// the last to go, however many light zones an agent looks up to flush it.
func (az *agentZones) makeRoom(now time.Time, window time.Duration, limit int) {
	lightest, least := "", math.Inf(1)
	for zone, zc := range az.zones {
		switch {
		case now.Sub(zc.start) >= window:
			delete(az.zones, zone)
		case zc.bits < least:
			lightest, least = zone, zc.bits
		}
	}
	if len(az.zones) >= limit {
		delete(az.zones, lightest)
	}
}

// forget drops agent's counters.
func (d *tunnelDetector) forget(agent string) { d.agents.Delete(agent) }

// information is how many bits s carries by its own statistics: its
// length times the Shannon entropy of its characters (case folded, dots
// included).
func information(s string) float64 {
	if len(s) == 0 {
		return 0
	}
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[lower(s[i])]++
	}
	n := float64(len(s))
	var h float64
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return n * h
}

// qtypeBit is qtype's bit in a name's set of query types asked.
func qtypeBit(qtype uint16) uint32 {
	if i, ok := forwardedTypes[qtype]; ok {
		return 1 << i
	}
	return 1 << 31
}

// foldedHash is the 64-bit FNV-1a hash of s, case folded, without
// allocating.
func foldedHash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(lower(s[i]))
		h *= 1099511628211
	}
	return h
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}
