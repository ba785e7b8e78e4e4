package tproxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// realHellos are ClientHellos captured from real clients, all with SNI
// api.example.test (testdata/clienthello/README.md).
func realHellos(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("testdata/clienthello/*.bin")
	require.NoError(t, err, "no ClientHello fixtures")
	require.NotEmpty(t, files, "no ClientHello fixtures")
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		out[strings.TrimSuffix(filepath.Base(f), ".bin")] = b
	}
	return out
}

func TestParseRealHellos(t *testing.T) {
	for name, b := range realHellos(t) {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, protoTLS, sniff(b), "sniff")
			// Every strict prefix is incomplete, never an error.
			for i := 1; i < len(b); i++ {
				done, err := helloComplete(b[:i])
				require.NoError(t, err, "prefix of %d bytes", i)
				require.False(t, done, "prefix of %d bytes: complete", i)
			}
			done, err := helloComplete(b)
			require.NoError(t, err, "whole hello")
			require.True(t, done, "whole hello: complete")
			h, err := parseHello(b)
			require.NoError(t, err, "parseHello")
			require.Equal(t, "api.example.test", h.serverName, "parseHello = %+v", h)
		})
	}
}

// TestHelloSplitAcrossRecords re-frames a real ClientHello into records
// of 100 bytes, as a client may: it is complete only with the last record.
func TestHelloSplitAcrossRecords(t *testing.T) {
	b := realHellos(t)["go1.26-default-x25519mlkem768"]
	msg := b[5:]
	var framed []byte
	for len(msg) > 0 {
		n := min(100, len(msg))
		framed = append(framed, 0x16, 0x03, 0x01, byte(n>>8), byte(n))
		framed = append(framed, msg[:n]...)
		msg = msg[n:]
	}
	last := len(framed) - 5 - 100
	done, err := helloComplete(framed[:last])
	require.NoError(t, err, "before the last record")
	require.False(t, done, "before the last record: complete")
	done, err = helloComplete(framed)
	require.NoError(t, err, "all records")
	require.True(t, done, "all records: complete")
	h, err := parseHello(framed)
	require.NoError(t, err, "parseHello")
	require.Equal(t, "api.example.test", h.serverName, "parseHello = %+v", h)
}

func TestSniff(t *testing.T) {
	tests := []struct {
		in   string
		want protocol
	}{
		{"", protoUnknown},
		{"\x16", protoUnknown},
		{"\x16\x03\x01", protoTLS},
		{"\x16\x01", protoOther},
		{"GET / HTTP/1.1\r\n", protoHTTP},
		{"POST /x", protoHTTP},
		{"GE", protoUnknown},
		{"OPTIONS * HTTP/1.1", protoHTTP},
		{"SSH-2.0-OpenSSH_9.6\r\n", protoOther},
		{"\x00\x00\x00\x4a\x00", protoOther},
		{"*1\r\n$4\r\nPING\r\n", protoOther}, // Redis
		{"get key\r\n", protoOther},          // memcached
		{"0033git-upload-pack /x.git\x00host=h\x00", protoOther},
		{"x\n", protoOther},
		{"hello, world", protoOther},
		{"{\"op\":1}", protoOther},
		// Request lines a server takes, whatever the method's spelling:
		// HTTP, or text to read on until its line ends.
		{"get / HTTP/1.1\r\n", protoHTTP},
		{"get / HTTP/1.1", protoUnknown},
		{"M-SEARCH * HTTP/1.1\r\n", protoHTTP},
		{"ABCDEFGHIJKLMNOP / HTTP/1.1\r\n", protoHTTP},
		{"ABCDEFGHIJKLMNOP ", protoUnknown},
		{"GO / http/1.0\n", protoHTTP},
		{"\r\n\r\nget / HTTP/1.1\r\n", protoHTTP},
		{"\r\n", protoUnknown},
		{"x", protoUnknown},
		{"get /\x80\xff HTTP/1.1\r\n", protoHTTP},
		{"get\t/ HTTP/1.1\r\n", protoHTTP},   // a tab for the space
		{" \tget / HTTP/1.1\r\n", protoHTTP}, // whitespace before the method
		{"GET/", protoOther},                 // no method is followed by a slash
		{"get /\x01 HTTP/1.1\r\n", protoOther},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, sniff([]byte(tt.in)), "sniff(%q)", tt.in)
	}
}

func TestHelloErrors(t *testing.T) {
	for _, in := range []string{"\x17\x03\x01\x00\x05hello", "\x16\x03\x01\x00\x00", "\x16\x03\x01\xff\xff", "\x16\x03\x01\x00\x04\x02\x00\x00\x00"} {
		_, err := helloComplete([]byte(in))
		assert.Error(t, err, "helloComplete(%q) accepted it", in)
	}
	_, err := parseHello([]byte("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"))
	assert.Error(t, err, "parseHello accepted a truncated hello")
}

func FuzzHello(f *testing.F) {
	for _, b := range realHellos(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		done, err := helloComplete(b)
		if err != nil || !done {
			return
		}
		h, err := parseHello(b)
		if err == nil && len(h.serverName) > 255 {
			t.Fatalf("server name of %d bytes", len(h.serverName))
		}
	})
}

// withExtension appends a TLS extension to a ClientHello that fits in
// one record, fixing the three lengths around it.
func withExtension(t *testing.T, hello []byte, typ uint16, data []byte) []byte {
	t.Helper()
	b := append([]byte(nil), hello...)
	off := 5 + 4 + 2 + 32                       // record and handshake headers, version, random
	off += 1 + int(b[off])                      // session id
	off += 2 + (int(b[off])<<8 | int(b[off+1])) // cipher suites
	off += 1 + int(b[off])                      // compression methods
	extLen := int(b[off])<<8 | int(b[off+1])
	require.Equal(t, len(b), 5+(int(b[3])<<8|int(b[4])), "the ClientHello is not one record ending with its extensions")
	require.Equal(t, len(b), off+2+extLen, "the ClientHello is not one record ending with its extensions")
	add := 4 + len(data)
	b = append(b, byte(typ>>8), byte(typ), byte(len(data)>>8), byte(len(data)))
	b = append(b, data...)
	put16 := func(at, v int) { b[at], b[at+1] = byte(v>>8), byte(v) }
	put16(off, extLen+add)
	put16(3, len(b)-5)
	hs := len(b) - 9
	b[6], b[7], b[8] = byte(hs>>16), byte(hs>>8), byte(hs)
	return b
}

// TestEncryptedClientHelloRefused: with ECH the outer server name is a
// public front, not the server meant; judging it would let an allowed
// front carry a connection to any host behind it.
func TestEncryptedClientHelloRefused(t *testing.T) {
	hello := realHellos(t)["curl-7.88-openssl-3.0"]
	h, err := parseHello(hello)
	require.NoError(t, err, "the unchanged hello")
	require.Equal(t, "api.example.test", h.serverName, "the unchanged hello: %+v", h)
	ech := withExtension(t, hello, extensionECH, []byte{0x00, 0x00, 0x01, 0x00, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00})
	done, err := helloComplete(ech)
	require.NoError(t, err, "the hello with ECH is not complete")
	require.True(t, done, "the hello with ECH is not complete")
	_, err = parseHello(ech)
	require.ErrorIs(t, err, ErrECH, "parseHello")
	other := withExtension(t, hello, 0xfe0c, []byte{1, 2, 3})
	h, err = parseHello(other)
	require.NoError(t, err, "an unknown extension")
	require.Equal(t, "api.example.test", h.serverName, "an unknown extension: %+v", h)
}

// FuzzSniff: a classification, once made, never changes with the bytes
// that follow, so that what the proxy decided on the first read is what
// the whole stream would have been judged as.
func FuzzSniff(f *testing.F) {
	for _, seed := range []string{"GET / HTTP/1.1\r\n", "get / HTTP/1.1\r\n", "\r\nM-SEARCH * HTTP/1.1\r\n", "SSH-2.0-x\r\n", "\x16\x03\x01", "*1\r\n", "\x00\x01"} {
		f.Add([]byte(seed), []byte("\r\nHost: x\r\n\r\n"))
	}
	f.Fuzz(func(t *testing.T, b, more []byte) {
		got := sniff(b)
		if got == protoUnknown {
			return
		}
		if after := sniff(append(b[:len(b):len(b)], more...)); after != got {
			t.Fatalf("sniff(%q) = %v, but %v once %q follows", b, got, after, more)
		}
	})
}
