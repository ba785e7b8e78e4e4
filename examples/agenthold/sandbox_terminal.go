//go:build linux

package main

import (
	"io"
	"unicode/utf8"
)

// terminalFilter passes a sandbox's terminal output on to the operator's
// terminal without the controls through which a program can make that
// terminal act rather than show:
//
//   - every control string (OSC, DCS, APC, PM, SOS): OSC 52 writes the
//     operator's clipboard, which the operator may then paste into the
//     host's shell; iTerm2's OSC 1337 and kitty's OSC 5113 and APC
//     transfer files; xterm's DCS DECUDK binds keys to text the terminal
//     types when the operator presses them; DECRQSS answers as if typed;
//   - the window operations (CSI … t), which move, resize and iconify the
//     window and report its title as if typed; media copy (CSI … i),
//     which sends the screen to a printer command; ENQ, which has the
//     terminal type its answerback string.
//
// Colours, cursor movement, screen modes and every other CSI sequence
// pass, so that shells, editors and pagers work. The operator's terminal
// is taken to read UTF-8, as the sandbox is told (LANG=C.UTF-8): a control
// is recognised led by ESC or as a C1 character (U+0080–U+009F), and a
// byte of 0x80–0x9F that is not part of a whole character, which a
// terminal in an 8-bit mode would take for a C1 control, is taken for one
// too. A string ends where a terminal ends it (BEL, ST, CAN, SUB, or
// an ESC, which starts the next control), or sooner: what a terminal
// would still count as the string is then text to it, its introducer
// having been dropped. The filter holds at most one pending CSI sequence,
// so output of any length costs bounded memory, and a control split
// across writes is recognised all the same.
type terminalFilter struct {
	w     io.Writer
	state filterState
	// csi holds the CSI sequence being read, in its 7-bit form, until
	// its final byte says whether it passes: at most maxCSI bytes.
	csi []byte
	// char holds a UTF-8 character's first bytes until it is whole, so
	// that none of its bytes passes but as a part of it.
	char []byte
	out  []byte
}

type filterState int

const (
	ground    filterState = iota
	escape                // after ESC
	csiSeq                // in a CSI sequence
	csiDrop               // in a CSI sequence too long to pass, dropped to its end
	ctlString             // in a control string, dropped until its end
)

// maxCSI bounds a CSI sequence held back; a longer one is dropped.
const maxCSI = 64

func newTerminalFilter(w io.Writer) *terminalFilter {
	return &terminalFilter{w: w, csi: make([]byte, 0, maxCSI+1)}
}

// Write filters p and writes what passes. It reports len(p) written when
// the underlying writer took every byte that passed.
func (f *terminalFilter) Write(p []byte) (int, error) {
	f.out = f.out[:0]
	for _, b := range p {
		f.take(b)
	}
	if len(f.out) > 0 {
		if _, err := f.w.Write(f.out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// take runs one byte through the filter. A control's bytes are passed
// only once it is whole and known to pass; a byte a terminal would act on
// inside a control (a C0 control it executes there, say) cannot make one
// that passes here out of one that does not.
func (f *terminalFilter) take(b byte) {
	switch f.state {
	case ctlString:
		switch b {
		case 0x07, 0x18, 0x1a, 0x9c: // BEL, CAN, SUB, ST (bare or U+009C's second byte)
			f.state = ground
		case 0x1b:
			f.state = escape
		}
	case escape:
		switch {
		case b == ']' || b == 'P' || b == '_' || b == '^' || b == 'X':
			f.state = ctlString
		case b == '[':
			f.state = csiSeq
			f.csi = append(f.csi[:0], 0x1b, '[')
		case b == 0x1b, b < 0x20 && b != 0x18 && b != 0x1a, b == 0x7f:
			// a terminal executes a C0 control and ignores DEL here,
			// and is still after its ESC: so is the filter, dropping it
		case b == '\\', b == 0x18, b == 0x1a: // ST, or a control cancelled
			f.state = ground
		case b < 0x7f: // a final (ESC c) or the first intermediate (ESC ( B)
			f.state = ground
			f.out = append(f.out, 0x1b, b)
		default: // no escape sequence: the ESC is dropped, b read afresh
			f.state = ground
			f.take(b)
		}
	case csiSeq:
		switch {
		case b >= 0x20 && b <= 0x3f:
			f.csi = append(f.csi, b)
			if len(f.csi) > maxCSI {
				f.state = csiDrop
			}
		case b >= 0x40 && b <= 0x7e:
			if b != 't' && b != 'i' {
				f.out = append(append(f.out, f.csi...), b)
			}
			f.state = ground
		case b == 0x1b:
			f.state = escape
		case b == 0x18, b == 0x1a:
			f.state = ground
		case b < 0x20, b == 0x7f: // executed or ignored within it: dropped
		default: // no sequence: dropped, b read afresh
			f.state = ground
			f.take(b)
		}
	case csiDrop:
		switch {
		case b >= 0x40 && b <= 0x7e, b == 0x18, b == 0x1a:
			f.state = ground
		case b == 0x1b:
			f.state = escape
		case b >= 0x80:
			f.state = ground
			f.take(b)
		}
	default:
		f.ground(b)
	}
}

// ground takes a byte outside any control: ESC starts a control, a
// UTF-8 character passes whole once it is, unless it is a C1 control, and
// other bytes pass one by one, unless they are.
func (f *terminalFilter) ground(b byte) {
	if len(f.char) == 0 && b < utf8.RuneSelf {
		switch b {
		case 0x1b:
			f.state = escape
		case 0x05: // ENQ: the terminal would type its answerback string
		default:
			f.out = append(f.out, b)
		}
		return
	}
	f.char = append(f.char, b)
	if !utf8.FullRune(f.char) {
		return
	}
	r, size := utf8.DecodeRune(f.char)
	var rest [utf8.UTFMax]byte
	n := copy(rest[:], f.char[size:])
	switch {
	case r >= 0x80 && r <= 0x9f:
		f.c1(byte(r))
	case r == utf8.RuneError && size == 1: // no character: a byte alone
		if c := f.char[0]; c >= 0x80 && c <= 0x9f {
			f.c1(c)
		} else {
			f.out = append(f.out, c)
		}
	default:
		f.out = append(f.out, f.char[:size]...)
	}
	f.char = f.char[:0]
	for _, c := range rest[:n] { // what did not belong to it, afresh
		f.take(c)
	}
}

// c1 acts on the C1 control c: a string introducer starts a dropped
// string, CSI a sequence, and any other C1 control is dropped.
func (f *terminalFilter) c1(c byte) {
	switch c {
	case 0x90, 0x98, 0x9d, 0x9e, 0x9f: // DCS, SOS, OSC, PM, APC
		f.state = ctlString
	case 0x9b: // CSI
		f.state = csiSeq
		f.csi = append(f.csi[:0], 0x1b, '[')
	}
}
