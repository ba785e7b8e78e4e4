package mitm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/agenthold/egress/internal/redact"
)

// frameRedactor is the upstream end of an upgraded WebSocket connection,
// as the proxy sees it: what the client writes goes to the server as it
// is (or through a frameSubstituter); what the server sends is read frame by frame, and each message's
// payload passes through the redactor. Since a value and its placeholder
// differ in length, a data frame comes out as fragments of the same
// message (RFC 6455, section 5.4), each as soon as its bytes are certain,
// so that the stream keeps its pace whatever the frames' sizes. Control
// frames (close, ping, pong) are redacted whole. A frame the gateway
// cannot read (masked, or compressed: the request does not offer
// permessage-deflate) ends the connection.
type frameRedactor struct {
	conn io.ReadWriteCloser
	red  *redact.Replacer
	sub  *frameSubstituter // what the client writes, when a rule substitutes in it

	store []byte // where in lives
	in    []byte // read from the server, not yet parsed
	out   []byte // frames ready for the client

	// The frame being read.
	inFrame   bool
	fin       bool
	opcode    byte
	remaining uint64
	// The message being sent.
	msg        *redact.Stream
	msgOpcode  byte // text or binary
	msgStarted bool // its first frame went out: later ones are continuations
	err        error
}

func newFrameRedactor(conn io.ReadWriteCloser, red, sub *redact.Replacer) *frameRedactor {
	f := &frameRedactor{conn: conn, red: red, store: make([]byte, 64<<10)}
	if sub != nil {
		f.sub = &frameSubstituter{conn: conn, sub: sub}
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

// maxControlPayload is the most a control frame may carry.
const maxControlPayload = 125

func (f *frameRedactor) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		if err := f.step(); err != nil {
			f.err = err
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// step parses what is buffered, reading more when a frame needs it.
func (f *frameRedactor) step() error {
	if !f.inFrame {
		if ok, err := f.header(); err != nil || !ok {
			if err == nil {
				err = f.fill()
			}
			return err
		}
	}
	if f.opcode >= 8 { // a control frame: whole, and small
		if uint64(len(f.in)) < f.remaining {
			return f.fill()
		}
		payload := []byte(f.red.String(string(f.in[:f.remaining])))
		if len(payload) > maxControlPayload {
			payload = payload[:maxControlPayload]
		}
		f.in = f.in[f.remaining:]
		f.inFrame = false
		f.out = appendFrame(f.out, true, f.opcode, payload)
		return nil
	}
	if len(f.in) == 0 && f.remaining > 0 {
		return f.fill()
	}
	n := min(uint64(len(f.in)), f.remaining)
	chunk := f.msg.Feed(nil, f.in[:n])
	f.in = f.in[n:]
	f.remaining -= n
	last := f.remaining == 0 && f.fin
	if last {
		chunk = f.msg.Flush(chunk)
	}
	if len(chunk) > 0 || last {
		op := f.msgOpcode
		if f.msgStarted {
			op = 0 // continuation
		}
		f.out = appendFrame(f.out, last, op, chunk)
		f.msgStarted = !last
	}
	if f.remaining == 0 {
		f.inFrame = false
		if last {
			f.msg = nil
		}
	}
	return nil
}

// header parses the next frame's header if it is all buffered.
func (f *frameRedactor) header() (bool, error) {
	if len(f.in) < 2 {
		return false, nil
	}
	b0, b1 := f.in[0], f.in[1]
	if b0&0x70 != 0 {
		return false, errors.New("mitm: websocket frame with reserved bits (a compressed message) from the server: cannot redact it")
	}
	if b1&0x80 != 0 {
		return false, errors.New("mitm: masked websocket frame from the server")
	}
	need, length := 2, uint64(b1&0x7f)
	switch length {
	case 126:
		need = 4
	case 127:
		need = 10
	}
	if len(f.in) < need {
		return false, nil
	}
	switch length {
	case 126:
		length = uint64(binary.BigEndian.Uint16(f.in[2:4]))
	case 127:
		length = binary.BigEndian.Uint64(f.in[2:10])
	}
	f.fin, f.opcode, f.remaining = b0&0x80 != 0, b0&0x0f, length
	switch {
	case f.opcode >= 8 && (length > maxControlPayload || !f.fin):
		return false, fmt.Errorf("mitm: websocket control frame of %d bytes, fragmented or too long", length)
	case f.opcode == 0 && f.msg == nil:
		return false, errors.New("mitm: websocket continuation outside a message")
	case f.opcode > 0 && f.opcode < 8:
		if f.msg != nil {
			return false, errors.New("mitm: websocket message inside another")
		}
		f.msg, f.msgOpcode, f.msgStarted = f.red.Stream(), f.opcode, false
	}
	f.in = f.in[need:]
	f.inFrame = true
	return true, nil
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

// appendFrame appends an unmasked frame, as a server sends them.
func appendFrame(b []byte, fin bool, opcode byte, payload []byte) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, b0, byte(n))
	case n <= 0xffff:
		b = append(b, b0, 126, byte(n>>8), byte(n))
	default:
		b = append(b, b0, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}
