package mitm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/agenthold/egress/internal/redact"
)

// A WebSocket through an exchange that could carry a secret is rewritten
// message by message, in both directions: what the server sends is
// redacted (frameRedactor), and what the client sends has its
// placeholders replaced where a rule opts in (frameSubstituter). Since a
// value and its placeholder differ in length, a data frame comes out as
// fragments of the same message (RFC 6455, section 5.4), each as soon as
// its bytes are certain, so that the stream keeps its pace whatever the
// frames' sizes. A frame the gateway cannot read (masked the wrong way,
// or compressed: the request does not offer permessage-deflate) ends the
// connection.

// maxControlPayload is the most a control frame may carry.
const maxControlPayload = 125

// frameParser follows the frames of one direction of a WebSocket and
// writes them out rewritten.
type frameParser struct {
	masked bool // frames are a client's: masked in, and masked afresh out
	// rewriter is the replacer of a message of this opcode, nil to pass
	// it as it is; control rewrites a control frame's payload.
	rewriter func(opcode byte) *redact.Replacer
	control  func(payload []byte) []byte

	in  []byte // not yet parsed
	out []byte // frames ready to go on

	// The frame being read.
	inFrame   bool
	fin       bool
	opcode    byte
	remaining uint64
	mask      [4]byte
	maskPos   int
	// The message being sent.
	msg        *redact.Stream
	msgOpcode  byte
	msgStarted bool // its first frame went out: later ones are continuations
}

// step parses one frame's header, or what is buffered of its payload; it
// reports false when it needs more bytes.
func (p *frameParser) step() (bool, error) {
	if !p.inFrame {
		return p.header()
	}
	if p.opcode >= 8 { // a control frame: whole, and small
		if uint64(len(p.in)) < p.remaining {
			return false, nil
		}
		payload := p.control(p.unmask(p.in[:p.remaining]))
		if len(payload) > maxControlPayload {
			payload = payload[:maxControlPayload]
		}
		p.in = p.in[p.remaining:]
		p.inFrame = false
		p.out = p.appendFrame(p.out, true, p.opcode, payload)
		return true, nil
	}
	if len(p.in) == 0 && p.remaining > 0 {
		return false, nil
	}
	n := min(uint64(len(p.in)), p.remaining)
	chunk := p.msg.Feed(nil, p.unmask(p.in[:n]))
	p.in = p.in[n:]
	p.remaining -= n
	last := p.remaining == 0 && p.fin
	if last {
		chunk = p.msg.Flush(chunk)
	}
	if len(chunk) > 0 || last {
		op := p.msgOpcode
		if p.msgStarted {
			op = 0 // continuation
		}
		p.out = p.appendFrame(p.out, last, op, chunk)
		p.msgStarted = !last
	}
	if p.remaining == 0 {
		p.inFrame = false
		if last {
			p.msg = nil
		}
	}
	return true, nil
}

// header parses the next frame's header if it is all buffered.
func (p *frameParser) header() (bool, error) {
	if len(p.in) < 2 {
		return false, nil
	}
	b0, b1 := p.in[0], p.in[1]
	from := "server"
	if p.masked {
		from = "client"
	}
	if b0&0x70 != 0 {
		return false, fmt.Errorf("mitm: websocket frame with reserved bits (a compressed message) from the %s: cannot rewrite it", from)
	}
	if (b1&0x80 != 0) != p.masked {
		return false, fmt.Errorf("mitm: websocket frame from the %s masked the wrong way", from)
	}
	need, length := 2, uint64(b1&0x7f)
	switch length {
	case 126:
		need = 4
	case 127:
		need = 10
	}
	maskAt := need
	if p.masked {
		need += 4
	}
	if len(p.in) < need {
		return false, nil
	}
	switch length {
	case 126:
		length = uint64(binary.BigEndian.Uint16(p.in[2:4]))
	case 127:
		length = binary.BigEndian.Uint64(p.in[2:10])
	}
	p.fin, p.opcode, p.remaining = b0&0x80 != 0, b0&0x0f, length
	if p.masked {
		copy(p.mask[:], p.in[maskAt:need])
		p.maskPos = 0
	}
	switch {
	case p.opcode >= 8 && (length > maxControlPayload || !p.fin):
		return false, fmt.Errorf("mitm: websocket control frame of %d bytes, fragmented or too long", length)
	case p.opcode == 0 && p.msg == nil:
		return false, errors.New("mitm: websocket continuation outside a message")
	case p.opcode > 0 && p.opcode < 8:
		if p.msg != nil {
			return false, errors.New("mitm: websocket message inside another")
		}
		p.msg, p.msgOpcode, p.msgStarted = p.rewriter(p.opcode).Stream(), p.opcode, false
	}
	p.in = p.in[need:]
	p.inFrame = true
	return true, nil
}

// unmask unmasks b in place, continuing the frame's key; a server's frames
// are not masked.
func (p *frameParser) unmask(b []byte) []byte {
	if !p.masked {
		return b
	}
	for i := range b {
		b[i] ^= p.mask[p.maskPos&3]
		p.maskPos++
	}
	return b
}

// appendFrame appends a frame as this direction's sender sends them: a
// server's unmasked, a client's masked with a fresh random key (RFC 6455,
// section 5.3).
func (p *frameParser) appendFrame(b []byte, fin bool, opcode byte, payload []byte) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	var maskBit byte
	if p.masked {
		maskBit = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, b0, maskBit|byte(n))
	case n <= 0xffff:
		b = append(b, b0, maskBit|126, byte(n>>8), byte(n))
	default:
		b = append(b, b0, maskBit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if !p.masked {
		return append(b, payload...)
	}
	var key [4]byte
	rand.Read(key[:])
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i&3])
	}
	return b
}

// frameRedactor is the upstream end of an upgraded WebSocket connection,
// as the proxy sees it: what the server sends is read frame by frame and
// each message (and control frame) redacted; what the client writes goes
// to the server as it is, or through a frameSubstituter.
type frameRedactor struct {
	frameParser
	conn  io.ReadWriteCloser
	store []byte // where in lives
	sub   *frameSubstituter
	err   error
}

func newFrameRedactor(conn io.ReadWriteCloser, red, sub *redact.Replacer) *frameRedactor {
	f := &frameRedactor{conn: conn, store: make([]byte, 64<<10)}
	f.frameParser = frameParser{
		rewriter: func(byte) *redact.Replacer { return red },
		control:  func(b []byte) []byte { return []byte(red.String(string(b))) },
	}
	if sub != nil {
		f.sub = newFrameSubstituter(conn, sub)
	}
	return f
}

func (f *frameRedactor) Write(p []byte) (int, error) {
	if f.sub != nil {
		return f.sub.Write(p)
	}
	return f.conn.Write(p)
}

func (f *frameRedactor) Close() error { return f.conn.Close() }

func (f *frameRedactor) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		progressed, err := f.step()
		if err == nil && !progressed {
			err = f.fill()
		}
		f.err = err
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// fill reads more from the server into the free end of the store,
// moving what is left unparsed to its start first.
func (f *frameRedactor) fill() error {
	f.in = f.store[:copy(f.store, f.in)]
	n, err := f.conn.Read(f.store[len(f.in):])
	f.in = f.store[:len(f.in)+n]
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}
