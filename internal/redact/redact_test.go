package redact

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testPairs = []Pair{
	{"sk-live-7f3c9d1e2b4a6058", "PH-1"},
	{"c2stbGl2ZS03ZjNjOWQxZTJiNGE2MDU4", "UEgtMQ"},     // base64 of the value
	{"c2stbGl2ZS03ZjNjOWQxZTJiNGE2MDU4==", "UEgtMQ=="}, // a longer form that extends it
	{"ghp_abcdefghijklmnop", "PH-2"},
}

func TestString(t *testing.T) {
	r := New(testPairs)
	for in, want := range map[string]string{
		"":                                 "",
		"nothing here":                     "nothing here",
		"key=sk-live-7f3c9d1e2b4a6058&x=1": "key=PH-1&x=1",
		"sk-live-7f3c9d1e2b4a6058sk-live-7f3c9d1e2b4a6058":      "PH-1PH-1",
		"b64 c2stbGl2ZS03ZjNjOWQxZTJiNGE2MDU4== end":            "b64 UEgtMQ== end",
		"b64 c2stbGl2ZS03ZjNjOWQxZTJiNGE2MDU4 end":              "b64 UEgtMQ end",
		"two ghp_abcdefghijklmnop and sk-live-7f3c9d1e2b4a6058": "two PH-2 and PH-1",
		"near miss sk-live-7f3c9d1e2b4a605X":                    "near miss sk-live-7f3c9d1e2b4a605X",
	} {
		assert.Equal(t, want, r.String(in), "%q", in)
	}
	var none *Replacer
	assert.Equal(t, "sk-live-7f3c9d1e2b4a6058", none.String("sk-live-7f3c9d1e2b4a6058"))
	assert.Nil(t, New([]Pair{{"same", "same"}, {"", "x"}}))
}

// TestStreamMatchesString feeds random texts with the strings planted in
// them, cut at random points, and checks the stream's output is the
// one-shot result: no value survives a chunk boundary.
func TestStreamMatchesString(t *testing.T) {
	r := New(testPairs)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var b strings.Builder
		for range rng.IntN(20) {
			switch rng.IntN(4) {
			case 0:
				b.WriteString(testPairs[rng.IntN(len(testPairs))].Find)
			case 1:
				f := testPairs[rng.IntN(len(testPairs))].Find
				b.WriteString(f[:rng.IntN(len(f))]) // a prefix that goes nowhere
			default:
				for range rng.IntN(40) {
					b.WriteByte("abcs=-k2"[rng.IntN(8)])
				}
			}
		}
		text := b.String()
		s := r.Stream()
		var out []byte
		for rest := []byte(text); len(rest) > 0; {
			n := 1 + rng.IntN(min(len(rest), 50))
			out = s.Feed(out, rest[:n])
			assert.LessOrEqual(t, s.Held(), r.MaxHeld())
			rest = rest[n:]
		}
		out = s.Flush(out)
		require.Equal(t, r.String(text), string(out), "%q", text)
		require.NotContains(t, string(out), "sk-live-7f3c9d1e2b4a6058")

		// The reader, with reads of random sizes from a source that
		// gives random amounts.
		rd := r.Reader(&chunky{data: []byte(text), rng: rng})
		var got []byte
		for {
			buf := make([]byte, 1+rng.IntN(200))
			n, err := rd.Read(buf)
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
		}
		require.Equal(t, r.String(text), string(got), "reader: %q", text)
	}
}

// chunky gives its data in pieces of random sizes.
type chunky struct {
	data []byte
	rng  *rand.Rand
}

func (c *chunky) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 1+c.rng.IntN(60))], c.data)
	c.data = c.data[n:]
	return n, nil
}

// TestStreamHoldsOnlyPossibleStarts lets text through as soon as it
// cannot begin a value: a server-sent event's end passes at once.
func TestStreamHoldsOnlyPossibleStarts(t *testing.T) {
	s := New(testPairs).Stream()
	out := s.Feed(nil, []byte("data: {\"text\":\"hello\"}\n\n"))
	assert.Equal(t, "data: {\"text\":\"hello\"}\n\n", string(out))
	assert.Zero(t, s.Held())
	out = s.Feed(nil, []byte("data: sk-live-7f3c"))
	assert.Equal(t, "data: ", string(out), "a possible start of a value is held")
	out = s.Feed(nil, []byte("9d1e2b4a6058\n\n"))
	assert.Equal(t, "PH-1\n\n", string(out))
}

func TestReader(t *testing.T) {
	r := New(testPairs)
	src := strings.Repeat("x", 100) + "sk-live-7f3c9d1e2b4a6058" + strings.Repeat("y", 100)
	got, err := io.ReadAll(r.Reader(iotest.OneByteReader(strings.NewReader(src))))
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("x", 100)+"PH-1"+strings.Repeat("y", 100), string(got))
	require.NoError(t, iotest.TestReader(r.Reader(strings.NewReader("abc")), []byte("abc")))
}

func FuzzStream(f *testing.F) {
	f.Add([]byte("key=sk-live-7f3c9d1e2b4a6058 c2stbGl2ZS03ZjNjOWQxZTJiNGE2MDU4=="), uint8(3))
	r := New(testPairs)
	f.Fuzz(func(t *testing.T, data []byte, cut uint8) {
		s := r.Stream()
		var out []byte
		step := int(cut%32) + 1
		for i := 0; i < len(data); i += step {
			out = s.Feed(out, data[i:min(i+step, len(data))])
			if s.Held() > r.MaxHeld() {
				t.Fatalf("holding %d bytes, more than %d", s.Held(), r.MaxHeld())
			}
		}
		out = s.Flush(out)
		if want := r.String(string(data)); string(out) != want {
			t.Fatalf("the stream gave %q, the whole text %q", out, want)
		}
	})
}

// BenchmarkStream scans random bytes (a compressed download, say) for the
// forms of four secrets.
func BenchmarkStream(b *testing.B) {
	var pairs []Pair
	for _, v := range []string{"sk-live-7f3c9d1e2b4a6058", "ghp_abcdefghijklmnop0123", "AKIAabcdefghijklmnop", "xoxb-1234567890-abcdefgh"} {
		for _, form := range []string{v, strings.ToUpper(v), v + "==", "Bearer " + v, strings.ReplaceAll(v, "-", "%2D")} {
			pairs = append(pairs, Pair{form, "PLACEHOLDER"})
		}
	}
	r := New(pairs)
	data := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	b.SetBytes(int64(len(data)))
	s := r.Stream()
	out := make([]byte, 0, len(data)+1024)
	for b.Loop() {
		out = s.Feed(out[:0], data)
	}
}

// TestContainsFold: a Find string is found in any letter case, and only
// a Find string is.
func TestContainsFold(t *testing.T) {
	r := New(Forms("Sk-Mixed-AbCd0123", "ph-0000000000000000"))
	assert.True(t, r.ContainsFold("X-Sk-Mixed-Abcd0123"), "a capitalised echo")
	assert.True(t, r.ContainsFold("sk-mixed-abcd0123"), "a lower-cased echo")
	assert.True(t, r.ContainsFold("SK-MIXED-ABCD0123 and more"), "an upper-cased echo")
	assert.False(t, r.ContainsFold("Sk-Mixed-AbCd012"), "a part of it")
	assert.False(t, r.ContainsFold("ph-0000000000000000"), "the placeholder")
	var none *Replacer
	assert.False(t, none.ContainsFold("Sk-Mixed-AbCd0123"))
}

// TestForms checks that each form a server may echo a value in is found
// and replaced by the placeholder in the same form.
func TestForms(t *testing.T) {
	const value, ph = "sk/live+7f3c<9d1e>2b4a&6058 x", "agenthold-placeholder-0123456789abcdef"
	r := New(Forms(value, ph))
	type form struct {
		name string
		enc  func(string) string
	}
	jsonHTML := func(s string) string { b, _ := json.Marshal(s); return string(b[1 : len(b)-1]) }
	for _, f := range []form{
		{"raw", func(s string) string { return s }},
		{"upper-case", strings.ToUpper},
		{"lower-case", strings.ToLower},
		{"hex", func(s string) string { return hex.EncodeToString([]byte(s)) }},
		{"upper-case hex", func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }},
		{"JSON", jsonHTML},
		{"JSON with \\/", func(s string) string { return strings.ReplaceAll(jsonHTML(s), "/", `\/`) }},
		{"query", url.QueryEscape},
		{"path", url.PathEscape},
		{"query, lower-case hex", func(s string) string { return lowerHex(url.QueryEscape(s)) }},
		{"base64", func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }},
		{"base64 unpadded", func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte(s)) }},
		{"base64url", func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }},
		{"base64url unpadded", func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }},
	} {
		got := r.String("<<" + f.enc(value) + ">>")
		assert.Equal(t, "<<"+f.enc(ph)+">>", got, f.name)
	}
	// Inside a longer base64 text, at every alignment, the value's bytes
	// never decode back out.
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for pre := range 3 {
			text := enc.EncodeToString([]byte(strings.Repeat("h", pre) + "Authorization: Bearer " + value + "\r\n"))
			decoded, _ := enc.DecodeString(r.String(text))
			assert.NotContains(t, string(decoded), "7f3c<9d1e>2b4a", "base64 at offset %d", pre)
		}
	}
}
