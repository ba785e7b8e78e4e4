package tproxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"time"
)

// protocol is what a connection's first bytes say it speaks.
type protocol uint8

const (
	protoUnknown protocol = iota // not enough bytes yet
	protoTLS
	protoHTTP
	protoOther
)

// sniff classifies the first bytes of a connection. A TLS handshake
// record starts 0x16 0x03. An HTTP/1 request is any first line a server
// might take for a request line: a method (any token: a server such as
// Go's takes "get", "M-SEARCH" or a method of any length), a space, and a
// line that names "HTTP/" in any case, after the empty lines servers skip
// before a request. The common case, a method of capital letters and a
// space, is told without waiting for the line's end. Other TCP is bytes
// no request line begins with (a method of a character no token has, a
// control character after it) or a first line that does not name HTTP.
// A first line that could still become a request line is unknown: the
// caller reads on, and judges it as HTTP if it never ends (see
// session.run), so that no request passes unjudged for being spelt
// unusually, being long, or arriving slowly.
func sniff(b []byte) protocol {
	if len(b) == 0 {
		return protoUnknown
	}
	if b[0] == 0x16 {
		if len(b) < 2 {
			return protoUnknown
		}
		if b[1] == 0x03 {
			return protoTLS
		}
		return protoOther
	}
	if capitalMethod(b) {
		return protoHTTP
	}
	line := bytes.TrimLeft(b, " \t\r\n")
	method := 0
	for method < len(line) && isTokenChar(line[method]) {
		method++
	}
	switch {
	case method == len(line):
		return protoUnknown // a method, or empty lines, so far
	case method == 0 || line[method] != ' ' && line[method] != '\t':
		// (A lenient server takes any whitespace for the space, RFC
		// 9112 3.)
		return protoOther
	}
	for i, c := range line {
		switch {
		case c == '\n':
			if containsFold(line[:i], httpVersionPrefix) {
				return protoHTTP
			}
			return protoOther
		case c < ' ' && c != '\t' && c != '\r', c == 0x7f:
			return protoOther
		}
	}
	return protoUnknown
}

// capitalMethod reports whether b starts with 3 to 12 capital letters and
// a space, as nearly every HTTP request does.
func capitalMethod(b []byte) bool {
	for i, c := range b[:min(len(b), 13)] {
		switch {
		case c == ' ':
			return i >= 3
		case c < 'A' || c > 'Z':
			return false
		}
	}
	return false
}

// isTokenChar reports whether c may be in an HTTP token (RFC 9110 5.6.2),
// as a method is.
func isTokenChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// containsFold reports whether b holds the ASCII bytes sub, in any case.
func containsFold(b, sub []byte) bool {
	for i := 0; i+len(sub) <= len(b); i++ {
		if bytes.EqualFold(b[i:i+len(sub)], sub) { // not a name: a protocol token
			return true
		}
	}
	return false
}

var httpVersionPrefix = []byte("HTTP/")

// ErrECH says that a ClientHello offers Encrypted Client Hello, whose
// outer server name is not the server the client means to reach.
var ErrECH = errors.New("tproxy: TLS ClientHello uses Encrypted Client Hello; its real server name is hidden")

// extensionECH is the encrypted_client_hello extension (RFC 9849).
const extensionECH = 0xfe0d

// helloInfo is what the proxy keeps of a ClientHello.
type helloInfo struct {
	serverName string
	alpn       []string
}

// helloComplete reports whether b holds a whole ClientHello handshake
// message, which may span several TLS records (a post-quantum key share
// makes it larger than one TCP segment, and a client may split it into
// records of any size). It returns an error for bytes that are not a TLS
// handshake or a handshake that is not a ClientHello.
func helloComplete(b []byte) (bool, error) {
	var msg []byte // handshake bytes gathered from the records so far
	for len(b) > 0 {
		if len(b) < 5 {
			return false, nil
		}
		if b[0] != 0x16 {
			return false, errors.New("tproxy: not a TLS handshake record")
		}
		n := int(b[3])<<8 | int(b[4])
		if n == 0 || n > 1<<14+2048 {
			return false, errors.New("tproxy: TLS record length out of range")
		}
		if len(b) < 5+n {
			msg = append(msg, b[5:]...)
			break
		}
		msg = append(msg, b[5:5+n]...)
		b = b[5+n:]
	}
	if len(msg) > 0 && msg[0] != 1 {
		return false, errors.New("tproxy: first TLS handshake message is not a ClientHello")
	}
	if len(msg) < 4 {
		return false, nil
	}
	need := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
	return len(msg) >= need, nil
}

// parseHello parses a complete ClientHello with crypto/tls: a server
// handshake over the bytes, stopped as soon as the hello is read. It
// cannot block (its reads are of b, its writes discarded), so it needs
// no context: one that can be cancelled costs crypto/tls a goroutine.
func parseHello(b []byte) (helloInfo, error) {
	var info helloInfo
	var hasECH bool
	errStop := errors.New("stop")
	err := tls.Server(&replayConn{r: bytes.NewReader(b)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			info = helloInfo{serverName: h.ServerName, alpn: slices.Clone(h.SupportedProtos)}
			hasECH = slices.Contains(h.Extensions, extensionECH)
			return nil, errStop
		},
	}).Handshake()
	switch {
	case hasECH:
		return helloInfo{}, ErrECH
	case errors.Is(err, errStop):
		return info, nil
	case err == nil:
		return helloInfo{}, errors.New("tproxy: ClientHello parse did not stop")
	}
	// crypto/tls refuses a server name with a trailing dot; such a name
	// is judged by its normalised form.
	if name, dotErr := trailingDotServerName(b); dotErr == nil {
		return helloInfo{serverName: name}, nil
	} else if errors.Is(dotErr, ErrECH) {
		return helloInfo{}, ErrECH
	}
	return helloInfo{}, errors.Join(errors.New("tproxy: invalid ClientHello"), err)
}

// replayConn is a read-only net.Conn over bytes, for parsing a ClientHello
// with crypto/tls; what crypto/tls writes back (an alert) is discarded.
type replayConn struct {
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *replayConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *replayConn) Close() error                     { return nil }
func (c *replayConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *replayConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *replayConn) SetDeadline(time.Time) error      { return nil }
func (c *replayConn) SetReadDeadline(time.Time) error  { return nil }
func (c *replayConn) SetWriteDeadline(time.Time) error { return nil }
