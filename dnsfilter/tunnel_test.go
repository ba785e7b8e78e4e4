package dnsfilter

import (
	"bufio"
	"context"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

func TestInformation(t *testing.T) {
	assert.Zero(t, information(""))
	assert.Zero(t, information("aaaa"), "one symbol carries nothing")
	assert.InDelta(t, 4.0, information("abAB"), 1e-9, "two symbols, case folded: one bit each")
	assert.InDelta(t, 64.0, information("abcdefghijklmnop"), 1e-9, "sixteen distinct symbols: four bits each")
}

// tunnelNames are the names a tunnel would look up to carry data:
// encoded chunks of random bytes, in labels under zone.
func tunnelNames(n int, zone string, encode func([]byte) string) []string {
	rng := rand.New(rand.NewPCG(1, 2))
	var out []string
	for i := range n {
		chunk := make([]byte, 30)
		for j := range chunk {
			chunk[j] = byte(rng.UintN(256))
		}
		out = append(out, fmt.Sprintf("%s.%d.%s", encode(chunk), i, zone))
	}
	return out
}

var (
	base32Label = func(b []byte) string {
		return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
	}
	hexLabel = hex.EncodeToString
	// bitsLabel spells each bit as a letter: low entropy per character,
	// as an encoder trying to look ordinary would.
	bitsLabel = func(b []byte) string {
		var s strings.Builder
		for _, c := range b[:7] {
			for i := range 8 {
				s.WriteByte("ab"[c>>i&1])
			}
		}
		return s.String()
	}
)

// digitLabels spells the bytes as decimal digits, one label each: after
// the first names, every label is one seen before, and only their order
// carries the data.
func digitLabels(b []byte) string {
	var labels []string
	for _, c := range b[:12] {
		for _, d := range fmt.Sprintf("%03d", c) {
			labels = append(labels, string(d))
		}
	}
	return strings.Join(labels, ".")
}

// TestTunnelDetected: tunnels of the usual encodings are suspect within a
// few dozen queries, and once suspect, every later query in the window is.
func TestTunnelDetected(t *testing.T) {
	for _, tc := range []struct {
		name   string
		encode func([]byte) string
		within int
	}{
		{"base32 (iodine-like)", base32Label, 40},
		{"hex (dnscat2-like)", hexLabel, 40},
		{"one bit a letter", bitsLabel, 160},
		{"digits as an order of known labels", digitLabels, 80},
	} {
		d := newTunnelDetector(TunnelDetection{})
		now := time.Now()
		first := -1
		for i, name := range tunnelNames(200, "exfil.example", tc.encode) {
			s := d.observe("a1", name, dns.TypeA, false, now)
			if first < 0 && s.why != "" {
				first = i
				assert.True(t, s.changed, "%s: the first suspect query did not say it changed", tc.name)
				assert.Contains(t, s.why, "exfil.example", tc.name)
			}
			if first >= 0 {
				assert.NotEmpty(t, s.why, "%s: query %d after the first suspect one was not", tc.name, i)
			}
		}
		require.GreaterOrEqual(t, first, 0, "%s: never suspect", tc.name)
		assert.Less(t, first, tc.within, "%s: suspect only after %d queries", tc.name, first)
		t.Logf("%s: suspect at query %d", tc.name, first+1)
	}
}

// TestTunnelEvasion: the ways an agent would try to stay under the
// counters.
func TestTunnelEvasion(t *testing.T) {
	now := time.Now()
	t.Run("many distinct names of little information", func(t *testing.T) {
		for _, cfg := range []TunnelDetection{{MaxBits: 1e9, MaxLabels: 1e9}, {MaxBits: 1e9, MaxNames: 1e9}} {
			d := newTunnelDetector(cfg)
			var why string
			for i := range max(DefaultTunnelMaxNames, DefaultTunnelMaxLabels) + 1 {
				why = d.observe("a1", fmt.Sprintf("%d.count.example", i), dns.TypeA, false, now).why
			}
			assert.NotEmpty(t, why, "%+v: more distinct names or labels than the bound were not suspect", cfg)
		}
	})
	t.Run("case variations count once", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{MaxNames: 10})
		for _, name := range []string{"www.case.example", "WWW.case.example", "wWw.CASE.example.", "Www.Case.Example"} {
			for range 5 {
				assert.Empty(t, d.observe("a1", name, dns.TypeA, false, now).why, "%s: one name, counted as many", name)
			}
		}
	})
	t.Run("flushing the tunnel's zone with light zones", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{ZonesPerAgent: 8})
		names := tunnelNames(200, "exfil.example", base32Label)
		var why string
		for i, name := range names {
			why = d.observe("a1", name, dns.TypeA, false, now).why
			for j := range 16 { // more light zones than are tracked, between every two queries
				d.observe("a1", fmt.Sprintf("www.light%d-%d.example", i, j), dns.TypeA, false, now)
			}
		}
		assert.NotEmpty(t, why, "light zones flushed the tunnel's counters")
	})
	t.Run("spread over many zones", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{})
		var why string
		for z := range 200 {
			for _, name := range tunnelNames(30, fmt.Sprintf("zone%d.example", z), base32Label) {
				if why = d.observe("a1", name, dns.TypeA, false, now).why; why != "" {
					break
				}
			}
			if why != "" {
				break
			}
		}
		assert.Contains(t, why, "across", "a tunnel over 200 zones, each under its bound, was not suspect")
	})
	t.Run("one letter repeated still costs its length", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{})
		d.observe("a1", strings.Repeat("a", 40)+".zone.example", dns.TypeA, false, now)
		az, _ := d.agents.Load("a1")
		assert.Greater(t, az.(*agentZones).bits, 5.0)
	})
	t.Run("query types of one name", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{})
		for qt := range forwardedTypes {
			d.observe("a1", "x.types.example", qt, false, now)
		}
		az, _ := d.agents.Load("a1")
		assert.GreaterOrEqual(t, az.(*agentZones).bits, float64(len(forwardedTypes)-1), "each new type asked of a name costs a bit")
	})
	t.Run("another agent's lookups are not counted", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{})
		for _, name := range tunnelNames(200, "exfil.example", base32Label) {
			d.observe("a1", name, dns.TypeA, false, now)
		}
		assert.Empty(t, d.observe("a2", "www.exfil.example", dns.TypeA, false, now).why, "a2 suspect for a1's tunnel")
	})
	t.Run("a new window starts afresh", func(t *testing.T) {
		d := newTunnelDetector(TunnelDetection{Window: time.Minute})
		for _, name := range tunnelNames(200, "exfil.example", base32Label) {
			d.observe("a1", name, dns.TypeA, false, now)
		}
		assert.Empty(t, d.observe("a1", "www.exfil.example", dns.TypeA, false, now.Add(time.Minute)).why)
	})
}

// popularNames reads testdata/popular-names.txt and adds what a
// multi-region cloud inventory looks up: every service in every region.
func popularNames(t *testing.T) []string {
	f, err := os.Open("testdata/popular-names.txt")
	require.NoError(t, err)
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			names = append(names, line)
		}
	}
	require.NoError(t, sc.Err())
	regions := []string{"us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "eu-west-1", "eu-west-2", "eu-west-3",
		"eu-central-1", "eu-north-1", "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2", "sa-east-1"}
	for _, svc := range []string{"ec2", "sts", "ssm", "lambda", "logs", "dynamodb", "sqs", "sns", "monitoring", "ecs", "api.ecr", "kms"} {
		for _, r := range regions {
			names = append(names, svc+"."+r+".amazonaws.com")
		}
	}
	return names
}

// TestTunnelFalsePositives: one agent looks up every name of a realistic
// sample (registries, source and container hosts, CDNs, cloud and AI
// APIs, telemetry, a multi-region AWS inventory) in one window; none is
// suspect. It logs the heaviest zones against the bounds.
func TestTunnelFalsePositives(t *testing.T) {
	names := popularNames(t)
	d := newTunnelDetector(TunnelDetection{})
	now := time.Now()
	var flagged []string
	for _, name := range names {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS} { // as curl and browsers ask
			if s := d.observe("a1", name, qt, false, now); s.why != "" {
				flagged = append(flagged, name+": "+s.why)
				break
			}
		}
	}
	assert.Empty(t, flagged, "ordinary names suspect")
	az, _ := d.agents.Load("a1")
	heaviest, most := "", 0.0
	for zone, zc := range az.(*agentZones).zones {
		if zc.bits > most {
			heaviest, most = zone, zc.bits
		}
	}
	t.Logf("%d names, %d suspect (%.1f%%); heaviest zone %s: %.0f of %d bits; all zones: %.0f of %.0f bits", len(names), len(flagged),
		100*float64(len(flagged))/float64(len(names)), heaviest, most, DefaultTunnelMaxBits, az.(*agentZones).bits, d.cfg.MaxAgentBits)
}

// TestUnusualQueryTypesRefused: a query type outside what applications
// ask is refused, not forwarded: its number would be a channel.
func TestUnusualQueryTypesRefused(t *testing.T) {
	h := newHarness(t, []string{"*.exfil.test"}, nil)
	for _, qt := range []uint16{dns.TypeNULL, dns.TypeANY, 65280, 4242} {
		before := h.up.total()
		m := h.query("udp", "127.0.0.1", "x.exfil.test", qt, false)
		assert.Equal(t, dns.RcodeNotImplemented, m.Rcode, "type %d", qt)
		assert.Equal(t, before, h.up.total(), "type %d went upstream", qt)
		assert.Equal(t, ReasonQueryType, h.lastRecord().Reason)
	}
	before := h.up.total()
	h.query("udp", "127.0.0.1", "x.exfil.test", dns.TypeTXT, false)
	assert.Equal(t, before+1, h.up.total(), "TXT was not forwarded")
}

// TestTunnelThroughServer: through the real server, suspect queries are
// recorded with the reason and still answered; with Refuse, they are
// refused; the gateway's own lookups for the agent count too.
func TestTunnelThroughServer(t *testing.T) {
	names := tunnelNames(100, "exfil.test", base32Label)
	for _, refuse := range []bool{false, true} {
		h := newHarness(t, []string{"*.exfil.test"}, func(s *Server) { s.Tunnel = TunnelDetection{MaxBits: 2000, Refuse: refuse} })
		var rcode int
		for _, name := range names {
			rcode = h.query("udp", "127.0.0.1", name, dns.TypeA, true).Rcode
		}
		rec := h.lastRecord()
		assert.Contains(t, rec.Reason, ReasonTunnel, "refuse=%v: record %+v", refuse, rec)
		assert.Equal(t, !refuse, rec.Allowed, "refuse=%v: record %+v", refuse, rec)
		if refuse {
			assert.Equal(t, dns.RcodeRefused, rcode, "a suspect query was answered")
			before := h.up.total()
			_, err := h.srv.LookupNetIP(policy.WithAgent(context.Background(), "a1"), "ip", "www.exfil.test")
			require.Error(t, err, "the gateway resolved a suspect name for the agent")
			assert.Contains(t, err.Error(), ReasonTunnel)
			assert.Equal(t, before, h.up.total(), "a suspect name went upstream")
		} else {
			assert.NotEqual(t, dns.RcodeRefused, rcode, "a suspect query was refused without Refuse")
			// The gateway's own lookup for the agent (an SNI, a Host, a
			// CONNECT target) leaves its verdict for the record of the
			// connection it is for.
			notes := new(egresslog.Notes)
			ctx := egresslog.WithNotes(policy.WithAgent(context.Background(), "a1"), notes)
			h.srv.LookupNetIP(ctx, "ip", "www.exfil.test") // not in the zone: its verdict stands all the same
			assert.Contains(t, notes.Annotate("allowed by rule"), ReasonTunnel, "the lookup's verdict")
		}
	}
}

// BenchmarkTunnelObserve measures what the detector adds to a query: a
// name seen before in the window (the common case), and a new one.
func BenchmarkTunnelObserve(b *testing.B) {
	now := time.Now()
	b.Run("seen", func(b *testing.B) {
		d := newTunnelDetector(TunnelDetection{})
		d.observe("a1", "registry.npmjs.org", dns.TypeA, false, now)
		b.ReportAllocs()
		for b.Loop() {
			d.observe("a1", "registry.npmjs.org", dns.TypeA, false, now)
		}
	})
	b.Run("new", func(b *testing.B) {
		names := make([]string, 4096)
		for i := range names {
			names[i] = fmt.Sprintf("svc%d.us-east-1.amazonaws.com", i)
		}
		d := newTunnelDetector(TunnelDetection{MaxNames: 1e9, MaxLabels: 1e9, MaxBits: 1e12})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			d.observe("a1", names[i%len(names)], dns.TypeA, false, now)
			i++
		}
	})
}

// FuzzTunnelObserve: any name, however malformed, is counted or skipped
// without a panic, and the counters stay within their bounds.
func FuzzTunnelObserve(f *testing.F) {
	for _, s := range []string{"www.example.com", "a..b.example.", ".", "", "co.uk", "x.co.uk", "ÿ.example", "A.B.C.D.E.F.example"} {
		f.Add(s)
	}
	d := newTunnelDetector(TunnelDetection{MaxNames: 8, MaxLabels: 8, ZonesPerAgent: 4})
	now := time.Now()
	f.Fuzz(func(t *testing.T, name string) {
		d.observe("a1", name, dns.TypeA, false, now)
		v, ok := d.agents.Load("a1")
		if !ok {
			return
		}
		az := v.(*agentZones)
		az.mu.Lock()
		defer az.mu.Unlock()
		require.LessOrEqual(t, len(az.zones), 4, "zones tracked")
		for zone, zc := range az.zones {
			require.LessOrEqual(t, len(zc.names), 9, "names under %s", zone)
			require.LessOrEqual(t, len(zc.labels), 9, "labels under %s", zone)
		}
	})
}

// TestOrderOfUncachedLookupsIsNoChannel: data spelt as the order of
// lookups among a few names whose answers have a TTL of 0 (one nibble a
// lookup among 16 names) reaches the zone's name server no faster than
// the cache lets it (each name once per minCacheTTL), and the lookups
// that do reach it cost what choosing among the names tells.
func TestOrderOfUncachedLookupsIsNoChannel(t *testing.T) {
	h := newHarness(t, []string{"*.ttl0.test"}, func(s *Server) { s.Tunnel = TunnelDetection{Refuse: true} })
	rng := rand.New(rand.NewPCG(3, 4))
	secret := make([]byte, 100)
	for i := range secret {
		secret[i] = byte(rng.Uint32())
	}
	for _, b := range secret {
		for _, nibble := range []byte{b >> 4, b & 15} {
			h.query("udp", "127.0.0.1", fmt.Sprintf("n%x.ttl0.test", nibble), dns.TypeA, false)
		}
	}
	seen := 0
	for i := range 16 {
		seen += h.up.count(fmt.Sprintf("n%x.ttl0.test", i))
	}
	assert.LessOrEqual(t, seen, 16, "lookups of 16 names that reached the name server within %v", minCacheTTL)

	// Past the cache, a repeat costs log2(names) bits: 16 names asked
	// again and again reach a zone's bound, which they never would if
	// each repeat were answered from the cache.
	d := newTunnelDetector(TunnelDetection{MaxBits: 512})
	now := time.Now()
	suspect := func(upstream bool) int {
		for i := range 1000 {
			if d.observe("a1", fmt.Sprintf("n%x.order.example", i%16), dns.TypeA, upstream, now).why != "" {
				return i
			}
		}
		return -1
	}
	assert.Equal(t, -1, suspect(false), "repeats the cache answered were counted")
	d.forget("a1")
	at := suspect(true)
	assert.Positive(t, at, "repeats that went upstream were not counted")
	assert.Less(t, at, 200, "512 bits of 4-bit choices were not caught by the 200th lookup")
}
