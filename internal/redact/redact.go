// Package redact replaces a set of strings wherever they appear in text or
// in a stream, holding back only the bytes that could be the start of
// one: the gateway's way of putting placeholders back where a server
// echoed a secret's value. It imports only the standard library.
//
// Finding many strings in a fast stream uses a sampled q-gram filter:
// every string is at least minLen bytes long, so any occurrence covers one
// of the positions sampled every minLen-q+1 bytes with one of its own
// q-grams; a bitset of those q-grams' hashes rejects almost every sampled
// position with one load and one multiplication, and only the rare hits
// are checked against the strings. Streams are scanned at several GB/s
// whatever the number of strings.
package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/url"
	"slices"
	"strings"
	"unsafe"
)

// Pair is a string to find and what to put in its place.
type Pair struct {
	Find, Replace string
}

// Replacer finds and replaces a fixed set of strings. It is immutable and
// safe for concurrent use; a nil *Replacer replaces nothing.
type Replacer struct {
	pairs  []Pair // longest Find first
	maxLen int
	q      int // bytes in a gram
	stride int // distance between sampled positions
	filter []uint64
	grams  map[uint32][]gramRef
	starts [256][]int // by first byte, the pairs whose Find begins with it
	folded []string   // the Find strings lower-cased, for ContainsFold
}

// gramRef says that pairs[pair].Find has the gram at offset.
type gramRef struct {
	pair   int
	offset int
}

const filterBits = 18 // a 32 KiB bitset: stays in the L1 or L2 cache

// New compiles the pairs; empty Find strings, and pairs whose Find equals
// their Replace, are dropped, and of two pairs with one Find the first is
// kept. With nothing left to find it returns nil.
func New(pairs []Pair) *Replacer {
	seen := map[string]bool{}
	var kept []Pair
	for _, p := range pairs {
		if p.Find == "" || p.Find == p.Replace || seen[p.Find] {
			continue
		}
		seen[p.Find] = true
		kept = append(kept, p)
	}
	if len(kept) == 0 {
		return nil
	}
	slices.SortStableFunc(kept, func(a, b Pair) int { return len(b.Find) - len(a.Find) })
	r := &Replacer{pairs: kept, maxLen: len(kept[0].Find), filter: make([]uint64, 1<<filterBits/64), grams: map[uint32][]gramRef{}}
	minLen := len(kept[len(kept)-1].Find)
	r.q = min(4, minLen)
	r.stride = minLen - r.q + 1
	for i, p := range kept {
		if f := strings.ToLower(p.Find); !slices.Contains(r.folded, f) { // not a name: a secret's form
			r.folded = append(r.folded, f)
		}
		r.starts[p.Find[0]] = append(r.starts[p.Find[0]], i)
		for off := 0; off+r.q <= len(p.Find); off++ {
			g := r.gram(p.Find[off:])
			r.grams[g] = append(r.grams[g], gramRef{pair: i, offset: off})
			h := hash(g)
			r.filter[h>>6] |= 1 << (h & 63)
		}
	}
	return r
}

// gram packs the first q bytes of s.
func (r *Replacer) gram(s string) uint32 {
	var b [4]byte
	copy(b[:], s[:r.q])
	return binary.LittleEndian.Uint32(b[:])
}

func (r *Replacer) gramAt(b []byte, i int) uint32 {
	if r.q == 4 {
		return binary.LittleEndian.Uint32(b[i:])
	}
	var g [4]byte
	copy(g[:], b[i:i+r.q])
	return binary.LittleEndian.Uint32(g[:])
}

func hash(g uint32) uint32 { return (g * 0x9E3779B1) >> (32 - filterBits) }

// MaxHeld bounds the bytes a Stream holds back: a possible start of a
// Find string, or a whole one that a longer one may still extend.
func (r *Replacer) MaxHeld() int {
	if r == nil {
		return 0
	}
	return 2 * r.maxLen
}

// match is an occurrence of pairs[pair].Find at start.
type match struct{ start, pair int }

// matches returns the occurrences in b, leftmost first and, at one
// position, longest first, without overlaps.
func (r *Replacer) matches(b []byte) []match {
	var found []match
	for i := 0; i+r.q <= len(b); i += r.stride {
		g := r.gramAt(b, i)
		h := hash(g)
		if r.filter[h>>6]&(1<<(h&63)) == 0 {
			continue
		}
		for _, ref := range r.grams[g] {
			start := i - ref.offset
			find := r.pairs[ref.pair].Find
			if start < 0 || start+len(find) > len(b) || string(b[start:start+len(find)]) != find {
				continue
			}
			found = append(found, match{start: start, pair: ref.pair})
		}
	}
	if len(found) < 2 {
		return found
	}
	slices.SortFunc(found, func(a, b match) int {
		if a.start != b.start {
			return a.start - b.start
		}
		return a.pair - b.pair // pairs are longest first
	})
	out := found[:0]
	end := -1
	for _, m := range found {
		if m.start < end {
			continue // overlaps the one kept
		}
		out = append(out, m)
		end = m.start + len(r.pairs[m.pair].Find)
	}
	return out
}

// replace appends b to dst with ms replaced.
func (r *Replacer) replace(dst, b []byte, ms []match) []byte {
	last := 0
	for _, m := range ms {
		dst = append(dst, b[last:m.start]...)
		dst = append(dst, r.pairs[m.pair].Replace...)
		last = m.start + len(r.pairs[m.pair].Find)
	}
	return append(dst, b[last:]...)
}

// String returns s with every occurrence replaced; s itself, without
// allocating, when there is none.
func (r *Replacer) String(s string) string {
	if r == nil || len(s) < r.q {
		return s
	}
	b := unsafe.Slice(unsafe.StringData(s), len(s)) // only read
	ms := r.matches(b)
	if len(ms) == 0 {
		return s
	}
	return string(r.replace(nil, b, ms))
}

// partialTail returns how many bytes at the end of b are a proper prefix
// of some Find string, and so may be the start of one: the bytes a stream
// must hold back. The earliest such start gives the longest tail.
func (r *Replacer) partialTail(b []byte) int {
	for j := max(0, len(b)-(r.maxLen-1)); j < len(b); j++ {
		for _, i := range r.starts[b[j]] {
			f := r.pairs[i].Find
			if len(b)-j < len(f) && f[:len(b)-j] == string(b[j:]) {
				return len(b) - j
			}
		}
	}
	return 0
}

// Stream redacts a stream fed in pieces. It holds back at most MaxHeld
// bytes, and only while they could be the start of a Find string: text
// that cannot be (an event's final newline, say) passes at once.
type Stream struct {
	r    *Replacer
	held []byte
	buf  []byte
}

// Stream returns a new stream; for a nil Replacer, one that holds nothing
// back and replaces nothing.
func (r *Replacer) Stream() *Stream { return &Stream{r: r} }

// Feed appends to dst what of the stream so far is certain, redacted, and
// keeps the rest.
func (s *Stream) Feed(dst, src []byte) []byte {
	if s.r == nil {
		return append(dst, src...)
	}
	b := src
	if len(s.held) > 0 {
		s.buf = append(append(s.buf[:0], s.held...), src...)
		b = s.buf
	}
	ms := s.r.matches(b)
	safe := len(b) - s.r.partialTail(b)
	// A match that reaches into what may still grow is held whole: what
	// follows may make it part of a longer one.
	k := len(ms)
	for k > 0 && ms[k-1].start+len(s.r.pairs[ms[k-1].pair].Find) > safe {
		k--
		safe = min(safe, ms[k].start)
	}
	dst = s.r.replace(dst, b[:safe], ms[:k])
	s.held = append(s.held[:0], b[safe:]...)
	return dst
}

// Flush appends what is held back, redacted as it stands: the stream
// ended, or a frame did, and nothing will extend it.
func (s *Stream) Flush(dst []byte) []byte {
	if s.r == nil || len(s.held) == 0 {
		return dst
	}
	dst = s.r.replace(dst, s.held, s.r.matches(s.held))
	s.held = s.held[:0]
	return dst
}

// Held reports how many bytes are held back.
func (s *Stream) Held() int { return len(s.held) }

// Reader returns a reader of src, redacted. Where nothing is replaced it
// reads straight into the caller's buffer, so that a large body that
// holds no value costs its scan and no copy.
func (r *Replacer) Reader(src io.Reader) io.Reader {
	if r == nil {
		return src
	}
	return &reader{src: src, s: r.Stream()}
}

type reader struct {
	src  io.Reader
	s    *Stream
	out  []byte // redacted, not yet returned
	err  error
	done bool
}

func (rd *reader) Read(p []byte) (int, error) {
	if len(rd.out) > 0 {
		n := copy(p, rd.out)
		rd.out = rd.out[n:]
		return n, nil
	}
	if rd.done {
		return 0, rd.err
	}
	held := len(rd.s.held)
	if len(p) <= held+rd.s.r.maxLen {
		return rd.readSlow(p)
	}
	// The held bytes first, then what the source has, in p itself.
	copy(p, rd.s.held)
	n, err := rd.src.Read(p[held:])
	b := p[:held+n]
	if err != nil {
		rd.done, rd.err = true, err
		rd.s.held = rd.s.held[:0]
		rd.out = rd.s.r.replace(rd.out[:0], b, rd.s.r.matches(b))
		return rd.drain(p)
	}
	ms := rd.s.r.matches(b)
	if len(ms) > 0 {
		rd.s.held = rd.s.held[:0]
		rd.out = rd.s.Feed(rd.out[:0], b)
		return rd.drain(p)
	}
	safe := len(b) - rd.s.r.partialTail(b)
	rd.s.held = append(rd.s.held[:0], b[safe:]...)
	return safe, nil
}

// readSlow serves a buffer too small to hold the held bytes and a value.
func (rd *reader) readSlow(p []byte) (int, error) {
	buf := make([]byte, 4096)
	n, err := rd.src.Read(buf)
	rd.out = rd.s.Feed(rd.out[:0], buf[:n])
	if err != nil {
		rd.out = rd.s.Flush(rd.out)
		rd.done, rd.err = true, err
	}
	return rd.drain(p)
}

// drain returns what is redacted and waiting, and the end once all is out.
func (rd *reader) drain(p []byte) (int, error) {
	n := copy(p, rd.out)
	rd.out = rd.out[n:]
	if len(rd.out) == 0 && rd.done {
		return n, rd.err
	}
	return n, nil
}

// ContainsFold reports whether any Find string occurs in s, both
// lower-cased: for short text whose letter case a server or net/http may
// have changed (a header field's name), where String, which matches
// exactly, cannot be trusted to have found every echo.
func (r *Replacer) ContainsFold(s string) bool {
	if r == nil {
		return false
	}
	s = strings.ToLower(s) // not a name: any text
	for _, f := range r.folded {
		if strings.Contains(s, f) {
			return true
		}
	}
	return false
}

// Contains reports whether any Find string occurs in b.
func (r *Replacer) Contains(b []byte) bool {
	if r == nil {
		return false
	}
	for _, p := range r.pairs {
		if bytes.Contains(b, []byte(p.Find)) {
			return true
		}
	}
	return false
}

// Forms returns the pairs that replace value with placeholder in each
// form a server may echo it in: as it is, upper-cased and lower-cased;
// JSON-escaped (with and without HTML escaping, and with "\/");
// URL-encoded for a query, a form or a path (with upper- and lower-case
// hexadecimal); hexadecimal, in either case; and base64 in the standard
// and URL alphabets, padded, unpadded, and at each of the three
// alignments it can have inside a longer base64 text. Each encoded value
// is replaced by the placeholder in the same encoding. Forms of the
// aligned kind shorter than 8 bytes are left out: they would match
// unrelated text. Not among them: base64 broken into lines, JSON with
// every character escaped, and other encodings a server could choose
// for an echo.
func Forms(value, placeholder string) []Pair {
	var pairs []Pair
	add := func(f, r string) { pairs = append(pairs, Pair{f, r}) }
	add(value, placeholder)
	add(strings.ToUpper(value), strings.ToUpper(placeholder))
	add(strings.ToLower(value), strings.ToLower(placeholder)) // not a name: a secret
	add(hex.EncodeToString([]byte(value)), hex.EncodeToString([]byte(placeholder)))
	add(strings.ToUpper(hex.EncodeToString([]byte(value))), strings.ToUpper(hex.EncodeToString([]byte(placeholder))))
	for _, escapeHTML := range []bool{true, false} {
		v, p := jsonEscape(value, escapeHTML), jsonEscape(placeholder, escapeHTML)
		add(v, p)
		add(strings.ReplaceAll(v, "/", `\/`), strings.ReplaceAll(p, "/", `\/`))
	}
	for _, esc := range []func(string) string{url.QueryEscape, url.PathEscape} {
		v, p := esc(value), esc(placeholder)
		add(v, p)
		add(lowerHex(v), lowerHex(p))
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		add(enc.EncodeToString([]byte(value)), enc.EncodeToString([]byte(placeholder)))
	}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for offset := range 3 {
			if f := alignedBase64(enc, value, offset); len(f) >= 8 {
				add(f, alignedBase64(enc, placeholder, offset))
			}
		}
	}
	return pairs
}

// jsonEscape is s as inside a JSON string.
func jsonEscape(s string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	enc.Encode(s) // a string always encodes
	out := strings.TrimSuffix(b.String(), "\n")
	return out[1 : len(out)-1]
}

// lowerHex writes the hexadecimal digits of percent escapes in lower case.
func lowerHex(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1], b[i+2] = lower(b[i+1]), lower(b[i+2])
		}
	}
	return string(b)
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// alignedBase64 is the part of the base64 text of s, preceded by offset
// bytes, that depends on s alone: what s looks like at that alignment
// inside any longer base64 text.
func alignedBase64(enc *base64.Encoding, s string, offset int) string {
	x := make([]byte, offset+len(s))
	copy(x[offset:], s)
	text := enc.EncodeToString(x)
	from := (8*offset + 5) / 6 // the first character with no bit of the padding
	to := 8 * len(x) / 6       // the last whole character of s
	if from >= to {
		return ""
	}
	return text[from:to]
}
