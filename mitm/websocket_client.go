package mitm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/agenthold/egress/internal/redact"
)

// WebSocketSubstituter gives the replacer that puts an agent's secrets in
// place of their placeholders in the WebSocket text messages it sends to
// host, for the rules that opt in (vault implements it); nil replaces
// nothing.
type WebSocketSubstituter interface {
	WebSocketSubstitution(agent, host string) (*redact.Replacer, error)
}

// frameSubstituter is the client's side of an upgraded WebSocket: the
// frames the client writes are parsed (a client masks them), each text
// message's payload passes through the substituter and goes on to the
// server as fragments of the same message, masked afresh, as soon as its
// bytes are certain. Binary messages and control frames pass unchanged
// in content. A frame the gateway cannot read (unmasked, or compressed)
// ends the connection.
type frameSubstituter struct {
	conn io.Writer
	sub  *redact.Replacer

	in  []byte // written by the client, not yet parsed
	out []byte // frames ready for the server

	// The frame being read.
	inFrame   bool
	fin       bool
	opcode    byte
	remaining uint64
	mask      [4]byte
	maskPos   int
	// The message being sent: a text message through the substituter,
	// a binary one as it is.
	msg        *redact.Stream
	msgOpcode  byte
	msgStarted bool
}

func (f *frameSubstituter) Write(p []byte) (int, error) {
	f.in = append(f.in, p...)
	for {
		progressed, err := f.step()
		if err != nil {
			return 0, err
		}
		if !progressed {
			break
		}
	}
	if len(f.out) > 0 {
		_, err := f.conn.Write(f.out)
		f.out = f.out[:0]
		if err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// step parses one frame's header, or what is buffered of its payload; it
// reports whether it consumed anything.
func (f *frameSubstituter) step() (bool, error) {
	if !f.inFrame {
		return f.header()
	}
	if f.opcode >= 8 { // a control frame: whole, and small
		if uint64(len(f.in)) < f.remaining {
			return false, nil
		}
		payload := f.unmask(f.in[:f.remaining])
		f.in = f.in[f.remaining:]
		f.inFrame = false
		f.out = appendMaskedFrame(f.out, true, f.opcode, payload)
		return true, nil
	}
	if len(f.in) == 0 && f.remaining > 0 {
		return false, nil
	}
	n := min(uint64(len(f.in)), f.remaining)
	chunk := f.msg.Feed(nil, f.unmask(f.in[:n]))
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
		f.out = appendMaskedFrame(f.out, last, op, chunk)
		f.msgStarted = !last
	}
	if f.remaining == 0 {
		f.inFrame = false
		if last {
			f.msg = nil
		}
	}
	return true, nil
}

// unmask unmasks b in place, continuing the frame's key.
func (f *frameSubstituter) unmask(b []byte) []byte {
	for i := range b {
		b[i] ^= f.mask[f.maskPos&3]
		f.maskPos++
	}
	return b
}

// header parses the next frame's header if it is all buffered.
func (f *frameSubstituter) header() (bool, error) {
	if len(f.in) < 2 {
		return false, nil
	}
	b0, b1 := f.in[0], f.in[1]
	if b0&0x70 != 0 {
		return false, errors.New("mitm: websocket frame with reserved bits (a compressed message) from the client: cannot substitute in it")
	}
	if b1&0x80 == 0 {
		return false, errors.New("mitm: unmasked websocket frame from the client")
	}
	need, length := 2, uint64(b1&0x7f)
	switch length {
	case 126:
		need = 4
	case 127:
		need = 10
	}
	if len(f.in) < need+4 {
		return false, nil
	}
	switch length {
	case 126:
		length = uint64(binary.BigEndian.Uint16(f.in[2:4]))
	case 127:
		length = binary.BigEndian.Uint64(f.in[2:10])
	}
	f.fin, f.opcode, f.remaining = b0&0x80 != 0, b0&0x0f, length
	copy(f.mask[:], f.in[need:need+4])
	f.maskPos = 0
	switch {
	case f.opcode >= 8 && (length > maxControlPayload || !f.fin):
		return false, fmt.Errorf("mitm: websocket control frame of %d bytes, fragmented or too long", length)
	case f.opcode == 0 && f.msg == nil:
		return false, errors.New("mitm: websocket continuation outside a message")
	case f.opcode > 0 && f.opcode < 8:
		if f.msg != nil {
			return false, errors.New("mitm: websocket message inside another")
		}
		var sub *redact.Replacer // a binary message passes as it is
		if f.opcode == 1 {
			sub = f.sub
		}
		f.msg, f.msgOpcode, f.msgStarted = sub.Stream(), f.opcode, false
	}
	f.in = f.in[need+4:]
	f.inFrame = true
	return true, nil
}

// appendMaskedFrame appends a frame as a client sends them, masked with a
// fresh random key (RFC 6455, section 5.3).
func appendMaskedFrame(b []byte, fin bool, opcode byte, payload []byte) []byte {
	b0 := opcode
	if fin {
		b0 |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, b0, 0x80|byte(n))
	case n <= 0xffff:
		b = append(b, b0, 0x80|126, byte(n>>8), byte(n))
	default:
		b = append(b, b0, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	var key [4]byte
	rand.Read(key[:])
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i&3])
	}
	return b
}
