package mitm

import (
	"io"

	"github.com/agenthold/egress/internal/redact"
)

// WebSocketSubstituter gives the replacer that puts an agent's secrets in
// place of their placeholders in the WebSocket text messages it sends to
// host, for the rules that opt in (vault implements it); nil replaces
// nothing.
type WebSocketSubstituter interface {
	WebSocketSubstitution(agent, host string) (*Replacer, error)
}

// frameSubstituter is the client's side of an upgraded WebSocket: the
// frames the client writes are parsed, each text message's payload passes
// through the substituter, and binary messages and control frames pass
// unchanged in content; all go on to the server masked afresh.
type frameSubstituter struct {
	frameParser
	conn io.Writer
}

func newFrameSubstituter(conn io.Writer, sub *redact.Replacer) *frameSubstituter {
	return &frameSubstituter{conn: conn, frameParser: frameParser{
		masked: true,
		rewriter: func(opcode byte) *redact.Replacer {
			if opcode == 1 { // text
				return sub
			}
			return nil
		},
		control: func(b []byte) []byte { return b },
	}}
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
