package egresslog

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite golden files")

var goldenRecords = map[string]Record{
	"dns_denied": {
		Seq: 1, Time: time.Date(2026, 11, 29, 8, 0, 0, 123456789, time.UTC), Agent: "agent-1", Kind: KindDNS,
		Host: "exfil-4f2a9c.evil.example", Method: "TXT", Status: 3, Allowed: false, Reason: "no allow entry matches the host",
	},
	"tls_spliced": {
		Seq: 2, Time: time.Date(2026, 11, 29, 8, 0, 1, 0, time.UTC), Agent: "agent-1", Kind: KindTLS,
		Host: "api.github.com", Port: 443, Addr: netip.MustParseAddrPort("140.82.112.6:443"), Allowed: true,
		Reason: "allowed by rule", Rule: "*.github.com", BytesUp: 517, BytesDown: 1 << 20, Duration: 1500 * time.Millisecond,
	},
	"http_injected": {
		Seq: 3, Time: time.Date(2026, 11, 29, 8, 0, 2, 5000, time.UTC), Agent: "agent-2", Kind: KindHTTP,
		Host: "api.anthropic.com", Port: 443, Addr: netip.MustParseAddrPort("[2607:6bc0::10]:443"), Method: "POST",
		Path: "/v1/messages", Status: 200, Allowed: true, Reason: "allowed by rule", Rule: "api.anthropic.com",
		Secret: "anthropic", BytesUp: 1234, BytesDown: 56789, Duration: 2345678 * time.Microsecond,
	},
	"report_escapes": {
		Seq: 4, Time: time.Date(2026, 11, 29, 8, 0, 3, 0, time.UTC), Agent: "agent \"quoted\"", Kind: KindConnect,
		Host: "weird\\host\n\t\x01", Port: 8443, Allowed: true, Report: true, Reason: "line\u2028sep\u2029 ünïcode",
		Open: true,
	},
	"connect_to_address": {
		Seq: 5, Time: time.Date(2026, 11, 29, 8, 0, 4, 0, time.UTC), Agent: "agent-1", Kind: KindConnect,
		Host: "api.github.com", Port: 443, Addr: netip.MustParseAddrPort("140.82.112.6:443"), Target: "140.82.112.5:443",
		Allowed: true, Reason: "allowed by rule", Rule: "*.github.com", ConnID: 7,
	},
	"mcp_tool_refused": {
		Seq: 7, Time: time.Date(2026, 11, 29, 8, 0, 6, 0, time.UTC), Agent: "agent-1", Kind: KindHTTP,
		Host: "mcp.example.com", Port: 443, Method: "POST", Path: "/mcp", Status: 403,
		Reason: "the MCP tool is not allowed", Rule: "mcp https://mcp.example.com/mcp", Tool: "search,exec",
	},
	"http_traced": {
		Seq: 8, Time: time.Date(2026, 11, 29, 8, 0, 7, 0, time.UTC), Agent: "agent-1", Kind: KindHTTP,
		Host: "api.github.com", Port: 443, Method: "GET", Path: "/user", Status: 200, Allowed: true,
		Reason: "allowed by rule", Rule: "api.github.com", Trace: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	},
	"tls_kernel_relay": {
		Seq: 9, Time: time.Date(2026, 11, 29, 8, 0, 8, 0, time.UTC), Agent: "agent-1", Kind: KindTLS,
		Host: "api.github.com", Port: 443, Addr: netip.MustParseAddrPort("140.82.112.6:443"), Allowed: true,
		Reason: "closed", Rule: "*.github.com", BytesUp: 1517, BytesDown: 104857, Relay: RelayKernel,
		Duration: 1500 * time.Millisecond, ConnID: 9,
	},
	"refusals_summary": {
		Seq: 6, Time: time.Date(2026, 11, 29, 8, 0, 5, 0, time.UTC), Agent: "agent-1", Kind: KindDNS,
		Host: "q0.flood.example", Reason: "quota exceeded: dns queries", Count: 49990,
	},
}

// TestGoldenJSON pins the JSON form: fields, names and escaping. Run with
// -update after a deliberate change, which must only add fields.
func TestGoldenJSON(t *testing.T) {
	for name, r := range goldenRecords {
		t.Run(name, func(t *testing.T) {
			got := r.AppendJSON(nil)
			require.True(t, json.Valid(got), "invalid JSON: %s", got)
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				require.NoError(t, os.WriteFile(path, append(got, '\n'), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(append(got, '\n')), "JSON changed")
			back, err := ParseJSON(bytes.TrimSpace(want))
			require.NoError(t, err)
			assert.Equal(t, r, back, "round trip")
		})
	}
}

// TestCountOmitted: a count of 0 or 1 is no count at all.
func TestCountOmitted(t *testing.T) {
	for _, n := range []uint64{0, 1} {
		r := Record{Time: time.Unix(0, 0), Count: n}
		assert.NotContains(t, string(r.AppendJSON(nil)), FieldCount)
	}
	r := Record{Time: time.Unix(0, 0), Count: 2}
	assert.Contains(t, string(r.AppendJSON(nil)), `"count":2`)
}

func TestParseJSONRefusesMissingAllowed(t *testing.T) {
	_, err := ParseJSON([]byte(`{"seq":1,"time":"2026-11-29T08:00:00Z","agent":"a","kind":"tls"}`))
	assert.Error(t, err, "a record without allowed parsed")
	for _, bad := range []string{`{`, `{"allowed":true,"time":"yesterday"}`, `{"allowed":true,"time":"2026-11-29T08:00:00Z","addr":"nope"}`, `{"allowed":true,"time":"2026-11-29T08:00:00Z","duration_ms":1e300}`} {
		_, err := ParseJSON([]byte(bad))
		assert.Error(t, err, "ParseJSON(%s) succeeded", bad)
	}
}

func TestSanitize(t *testing.T) {
	r := Record{
		Path:   "/v1/x?key=agenthold-placeholder-abc#frag",
		Host:   strings.Repeat("h", 300),
		Reason: strings.Repeat("é", 400), // 800 bytes
		Agent:  strings.Repeat("a", 200),
	}
	r.sanitize()
	assert.Equal(t, "/v1/x", r.Path, "Path kept its query")
	assert.Equal(t, MaxHostLen, len(r.Host), "host bytes")
	assert.Equal(t, MaxAgentLen, len(r.Agent), "agent bytes")
	assert.LessOrEqual(t, len(r.Reason), MaxReasonLen, "reason cut badly: too many bytes")
	assert.True(t, utf8.ValidString(r.Reason), "reason cut badly: invalid UTF-8")
}

// TestSanitizeKeepsNoCallersString: each field is a copy of its own, so
// that a kept record holds none of a larger string its value was cut
// from: a request line, with a query as large as a header may be.
func TestSanitizeKeepsNoCallersString(t *testing.T) {
	line := "GET /ok?" + strings.Repeat("q", 60<<10) + " HTTP/1.1"
	r := Record{Method: line[:3], Path: line[4:], Host: line[4:7], Reason: line[4:10], Tool: line[5:7]}
	r.sanitize()
	require.Equal(t, "/ok", r.Path)
	start := uintptr(unsafe.Pointer(unsafe.StringData(line)))
	for _, s := range []string{r.Method, r.Path, r.Host, r.Reason, r.Tool} {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		assert.False(t, p >= start && p < start+uintptr(len(line)), "%q is part of the caller's string", s)
	}
}

// TestTraceParentKeptOnlyWellFormed: the traceparent a request carried
// is the agent's own text; the Log keeps a well-formed one and drops
// anything else, which could otherwise carry up to a header's worth of
// the agent's bytes into every sink.
func TestTraceParentKeptOnlyWellFormed(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		value string
		kept  bool
	}{
		{good, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true}, // not sampled: still the agent's trace
		{"", false},
		{strings.ToUpper(good), false},
		{"01" + good[2:], false}, // a version this gateway does not know
		{good + "-extra", false}, // version 00 has exactly four fields
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false}, // all-zero trace ID
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false}, // all-zero parent ID
		{"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", false},
		{"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n", false},
	} {
		r := Record{Trace: tc.value}
		r.sanitize()
		if tc.kept {
			assert.Equal(t, tc.value, r.Trace, "%q", tc.value)
		} else {
			assert.Empty(t, r.Trace, "%q kept", tc.value)
		}
	}
}

// TestSanitizeEscapesControls keeps a hostile name, path or reason from
// forging lines in a table, a text log or a metric label.
func TestSanitizeEscapesControls(t *testing.T) {
	r := Record{
		Host:   "evil.test\nFORGED allowed",
		Path:   "/a\r\nb",
		Reason: "upstream: boom\n\x1b[31mred\x7f",
		Rule:   "tab\there",
	}
	r.sanitize()
	assert.Equal(t, `evil.test\nFORGED allowed`, r.Host)
	assert.Equal(t, `/a\r\nb`, r.Path)
	assert.Equal(t, `upstream: boom\n\x1b[31mred\x7f`, r.Reason)
	assert.Equal(t, `tab\there`, r.Rule)
	r = Record{Path: "/\u202eexe.gnp\u202c/a\u200bb", Reason: "c1\u0085next\xffraw"}
	r.sanitize()
	assert.Equal(t, `/\u202eexe.gnp\u202c/a\u200bb`, r.Path, "text that reorders or hides what shows")
	assert.Equal(t, "c1\\u0085next\xffraw", r.Reason, "a C1 control; a byte that is not UTF-8 kept")
	clean := "plain é ✓"
	assert.Equal(t, clean, escapeControls(clean))
	assert.Zero(t, testing.AllocsPerRun(100, func() { escapeControls(clean) }), "a clean string allocates")
}

func FuzzAppendJSON(f *testing.F) {
	f.Add("agent", "host.example", "/path", "reason \"x\"", int64(1), int64(1500))
	f.Add("\xff\xfe", "\u2028", "\x00", "\\", int64(-1), int64(0))
	f.Fuzz(func(t *testing.T, agent, host, path, reason string, bytesUp, durMicros int64) {
		r := Record{Seq: 9, Time: time.Unix(1700000000, 42).UTC(), Agent: agent, Kind: KindHTTP, Host: host, Path: path,
			Reason: reason, BytesUp: bytesUp, Duration: time.Duration(durMicros%1e12) * time.Microsecond, Allowed: true}
		b := r.AppendJSON(nil)
		require.True(t, json.Valid(b), "invalid JSON for %+v: %q", r, b)
		require.False(t, bytes.ContainsAny(b, "\n\r"), "raw newline in %q", b)
		back, err := ParseJSON(b)
		require.NoError(t, err)
		if utf8.ValidString(agent) {
			require.Equal(t, agent, back.Agent, "round trip changed strings: %+v vs %+v", back, r)
		}
		if utf8.ValidString(reason) {
			require.Equal(t, reason, back.Reason, "round trip changed strings: %+v vs %+v", back, r)
		}
		require.Equal(t, bytesUp, back.BytesUp, "round trip changed numbers: %+v vs %+v", back, r)
		require.Equal(t, r.Duration, back.Duration, "round trip changed numbers: %+v vs %+v", back, r)
	})
}
