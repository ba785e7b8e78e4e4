package tproxy

import (
	"errors"
	"strings"

	"golang.org/x/crypto/cryptobyte"

	"github.com/agenthold/egress/internal/hostname"
)

// extensionServerName is the server_name extension (RFC 6066).
const extensionServerName = 0

// errMalformedHello is what the strict parser says of anything it does not
// take whole.
var errMalformedHello = errors.New("tproxy: malformed ClientHello")

// helloMessage gathers the handshake bytes of a complete ClientHello from
// its records: the message with its 4-byte header, exactly.
func helloMessage(b []byte) ([]byte, error) {
	var msg []byte
	for len(b) > 0 {
		if len(b) < 5 || b[0] != 0x16 {
			return nil, errMalformedHello
		}
		n := int(b[3])<<8 | int(b[4])
		if len(b) < 5+n {
			return nil, errMalformedHello
		}
		msg = append(msg, b[5:5+n]...)
		b = b[5+n:]
	}
	if len(msg) < 4 || msg[0] != 1 {
		return nil, errMalformedHello
	}
	n := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
	if len(msg) != n {
		return nil, errMalformedHello
	}
	return msg, nil
}

// trailingDotServerName reads, strictly, the server name of a ClientHello
// that crypto/tls refused, and returns it normalised if it is a valid name
// but for one trailing dot (which RFC 6066 forbids and crypto/tls
// refuses, yet clients send when given a fully qualified name). Anything
// else, ECH included, is an error: the caller keeps crypto/tls's refusal.
func trailingDotServerName(b []byte) (string, error) {
	msg, err := helloMessage(b)
	if err != nil {
		return "", err
	}
	s := cryptobyte.String(msg[4:])
	var version uint16
	var sessionID, ciphers, compression, exts cryptobyte.String
	if !s.ReadUint16(&version) || !s.Skip(32) ||
		!s.ReadUint8LengthPrefixed(&sessionID) || len(sessionID) > 32 ||
		!s.ReadUint16LengthPrefixed(&ciphers) || len(ciphers) == 0 || len(ciphers)%2 != 0 ||
		!s.ReadUint8LengthPrefixed(&compression) || len(compression) == 0 ||
		!s.ReadUint16LengthPrefixed(&exts) || !s.Empty() {
		return "", errMalformedHello
	}
	seen := map[uint16]bool{}
	name := ""
	for !exts.Empty() {
		var typ uint16
		var data cryptobyte.String
		if !exts.ReadUint16(&typ) || !exts.ReadUint16LengthPrefixed(&data) || seen[typ] {
			return "", errMalformedHello
		}
		seen[typ] = true
		switch typ {
		case extensionECH:
			return "", ErrECH
		case extensionServerName:
			var list cryptobyte.String
			if !data.ReadUint16LengthPrefixed(&list) || !data.Empty() || list.Empty() {
				return "", errMalformedHello
			}
			for !list.Empty() {
				var nameType uint8
				var host cryptobyte.String
				if !list.ReadUint8(&nameType) || !list.ReadUint16LengthPrefixed(&host) || len(host) == 0 {
					return "", errMalformedHello
				}
				if nameType != 0 {
					continue
				}
				if name != "" {
					return "", errMalformedHello // one host_name only
				}
				name = string(host)
			}
		}
	}
	if !strings.HasSuffix(name, ".") || strings.HasSuffix(name, "..") {
		return "", errMalformedHello
	}
	return hostname.Normalize(name)
}
