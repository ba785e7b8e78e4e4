package tproxy

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/cryptobyte"

	"github.com/agenthold/egress/egresslog"
)

// withServerName rebuilds a one-record ClientHello with its server_name
// extension's host names replaced by names.
func withServerName(t testing.TB, hello []byte, names ...string) []byte {
	t.Helper()
	msg, err := helloMessage(hello)
	require.NoError(t, err)
	s := cryptobyte.String(msg[4:])
	var version uint16
	var random []byte
	var sessionID, ciphers, compression, exts cryptobyte.String
	require.True(t, s.ReadUint16(&version) && s.ReadBytes(&random, 32) && s.ReadUint8LengthPrefixed(&sessionID) &&
		s.ReadUint16LengthPrefixed(&ciphers) && s.ReadUint8LengthPrefixed(&compression) && s.ReadUint16LengthPrefixed(&exts))
	var b cryptobyte.Builder
	b.AddUint8(0x16)
	b.AddUint16(0x0301)
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
		b.AddUint8(1)
		b.AddUint24LengthPrefixed(func(b *cryptobyte.Builder) {
			b.AddUint16(version)
			b.AddBytes(random)
			b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(sessionID) })
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(ciphers) })
			b.AddUint8LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(compression) })
			b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
				for !exts.Empty() {
					var typ uint16
					var data cryptobyte.String
					require.True(t, exts.ReadUint16(&typ) && exts.ReadUint16LengthPrefixed(&data))
					b.AddUint16(typ)
					b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
						if typ != extensionServerName {
							b.AddBytes(data)
							return
						}
						b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) {
							for _, n := range names {
								b.AddUint8(0)
								b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(n)) })
							}
						})
					})
				}
			})
		})
	})
	out, err := b.Bytes()
	require.NoError(t, err)
	return out
}

// TestTrailingDotServerName: a server name with a trailing dot, which
// crypto/tls refuses, is judged by its normalised name; nothing else that
// crypto/tls refuses gets through.
func TestTrailingDotServerName(t *testing.T) {
	hello := realHellos(t)["curl-7.88-openssl-3.0"]
	same := withServerName(t, hello, "api.example.test")
	h, err := parseHello(same)
	require.NoError(t, err, "the rebuilt hello, unchanged")
	require.Equal(t, "api.example.test", h.serverName)

	for _, tc := range []struct {
		names []string
		want  string // "" for an error
	}{
		{[]string{"API.Example.Test."}, "api.example.test"},
		{[]string{"api.example.test.."}, ""},
		{[]string{"."}, ""},
		{[]string{"api.example.test.", "other.test."}, ""},
		{[]string{"bad_name!.test."}, ""},
		{[]string{"1.2.3.4."}, ""},
	} {
		h, err := parseHello(withServerName(t, hello, tc.names...))
		if tc.want == "" {
			assert.Error(t, err, "%q", tc.names)
			continue
		}
		if assert.NoError(t, err, "%q", tc.names) {
			assert.Equal(t, tc.want, h.serverName, "%q", tc.names)
		}
	}
	ech := withExtension(t, withServerName(t, hello, "api.example.test."), extensionECH, []byte{0, 0, 1, 0, 1, 1, 0, 0, 0, 0})
	_, err = parseHello(ech)
	assert.ErrorIs(t, err, ErrECH)
}

// TestTrailingDotThroughTheProxy: such a hello is judged and recorded by
// its normalised name, allowed or not.
func TestTrailingDotThroughTheProxy(t *testing.T) {
	w := newWorld(t, []string{"api.test:*"}, nil)
	hello := realHellos(t)["curl-7.88-openssl-3.0"]
	for _, tc := range []struct {
		sni, host string
		allowed   bool
	}{{"API.TEST.", "api.test", true}, {"Blocked.Test.", "blocked.test", false}} {
		c := w.dial(w.tlsAddr)
		_, err := c.Write(withServerName(t, hello, tc.sni))
		require.NoError(t, err)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, c) // the server refuses the dot, or the proxy the name
		c.Close()
		r := w.waitRecord(func(r egresslog.Record) bool { return r.Kind == egresslog.KindTLS && r.Host == tc.host })
		assert.Equal(t, tc.allowed, r.Allowed, "%+v", r)
	}
}

// FuzzTrailingDotServerName: the strict parser never panics, and what it
// takes is a valid name that crypto/tls would take but for the dot.
func FuzzTrailingDotServerName(f *testing.F) {
	for _, b := range realHellos(f) {
		f.Add(b)
	}
	f.Add(withServerName(f, realHellos(f)["curl-7.88-openssl-3.0"], "API.example.test."))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := trailingDotServerName(b)
		if err != nil {
			return
		}
		if name == "" || len(name) > 253 || name[len(name)-1] == '.' {
			t.Fatalf("took server name %q", name)
		}
	})
}
