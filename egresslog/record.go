package egresslog

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind is what a record describes.
type Kind string

// The kinds of record.
const (
	KindDNS     Kind = "dns"     // one DNS query
	KindTLS     Kind = "tls"     // one TLS connection, judged by SNI (spliced or intercepted)
	KindHTTP    Kind = "http"    // one plain or intercepted HTTP request
	KindTCP     Kind = "tcp"     // one other TCP connection, judged by the resolved name
	KindConnect Kind = "connect" // one explicit-proxy CONNECT tunnel
	// KindApproval is an approval request raised for a destination no
	// entry allowed (Reason "approval requested"), or its answer.
	KindApproval Kind = "approval"
)

// Record is one DNS query, connection or HTTP request. It has no field that
// could hold a secret's value: Secret is the secret's name, and Path never
// includes the query string, where a credential may have been placed.
type Record struct {
	Seq   uint64         // order across all agents, set by Log.Record
	Time  time.Time      // when it started; zero means now
	Agent string         // who
	Kind  Kind           // what
	Host  string         // the name (or address) the decision was made on
	Port  uint16         // destination port
	Addr  netip.AddrPort // the address actually dialled, if any
	// Target is where an explicit-proxy client asked to go (a CONNECT
	// target, "host:port" as sent), when the decision may have been made
	// on another name: a TLS server name or Host inside a tunnel to an
	// address.
	Target  string
	Method  string // HTTP method, or DNS query type ("A", "TXT")
	Path    string // HTTP path, without the query string
	Status  int    // HTTP status, or DNS rcode
	Answers int    // DNS answers returned to the agent
	Allowed bool   // false: denied
	Report  bool   // allowed only because the policy is in report mode
	Reason  string // why it was allowed or denied, or how it ended
	Rule    string // the policy entry or injection rule that matched
	Secret  string // the name of the secret injected, if any
	Tool    string // the MCP tools a request called (comma-separated)
	// Trace is the W3C traceparent the agent's HTTP request carried, so
	// that the request can be found in the agent's own trace. The Log
	// keeps it only if it is well formed (version 00, lowercase hex).
	Trace string
	// BytesUp and BytesDown are the bytes from the agent towards the
	// destination and back: of an HTTP request, its head and body, and
	// its response's (each head as HTTP/1.1 writes it), and an upgrade's
	// tunnel. Of a connection, what the gateway's socket towards the
	// other side took to send, whatever moved it (Relay): a reset may
	// still drop bytes of it that were queued, unsent.
	BytesUp   int64
	BytesDown int64
	// Relay is how a passed-through connection's bytes were moved:
	// RelayKernel, RelaySplice or RelayCopy. Empty on other records.
	Relay    string
	Duration time.Duration // how long it lasted
	Open     bool          // the connection is still open (see Log.OpenConns)
	// ConnID identifies a connection record (set by Log.Begin), and, on an
	// HTTP record, the recorded connection that carried the request (an
	// intercepted TLS connection, a CONNECT tunnel): the request's bytes
	// are then part of that connection's, and counted there only. Zero
	// means none.
	ConnID uint64
	// Count is how many refusals a summary stands for: the refusals of
	// one agent, kind and reason in one second beyond Log.DenialBurst,
	// folded into this one record. Zero on every other record; only the
	// Log sets it (Record and Conn.End ignore a caller's).
	Count uint64
}

// JSON field names of a record, one object per line. The form is stable:
// fields are only ever added. Empty and zero fields are omitted, except
// time, seq, agent, kind and allowed.
const (
	FieldSeq       = "seq"
	FieldTime      = "time" // RFC 3339 with nanoseconds, UTC
	FieldAgent     = "agent"
	FieldKind      = "kind"
	FieldHost      = "host"
	FieldPort      = "port"
	FieldAddr      = "addr" // "ip:port"
	FieldTarget    = "target"
	FieldMethod    = "method"
	FieldPath      = "path"
	FieldStatus    = "status"
	FieldAnswers   = "answers"
	FieldAllowed   = "allowed"
	FieldReport    = "report"
	FieldReason    = "reason"
	FieldRule      = "rule"
	FieldSecret    = "secret"
	FieldTool      = "tool"
	FieldTrace     = "traceparent"
	FieldBytesUp   = "bytes_up"
	FieldBytesDown = "bytes_down"
	FieldRelay     = "relay"       // "kernel", "splice" or "copy"
	FieldDuration  = "duration_ms" // float milliseconds
	FieldOpen      = "open"
	FieldConnID    = "conn"
	FieldCount     = "count" // refusals a summary stands for; omitted when 0 or 1
)

// How a passed-through connection's bytes were moved (Record.Relay).
const (
	RelayKernel = "kernel" // between the two sockets in the kernel (a BPF sockmap): never read by the gateway
	RelaySplice = "splice" // through a pipe in the kernel, by the gateway's system calls
	RelayCopy   = "copy"   // through the gateway's memory
)

// Bounds on the strings a record keeps; longer ones are cut at a UTF-8
// boundary.
const (
	MaxAgentLen  = 128
	MaxHostLen   = 255
	MaxMethodLen = 32
	MaxPathLen   = 1024
	MaxReasonLen = 512
	MaxRuleLen   = 256
	MaxSecretLen = 128
	MaxToolLen   = 256
)

// sanitize bounds the record's strings, escapes their control characters
// (so no sink, table or metric label ever shows a raw newline that could
// forge a line), and drops the query string. Each string is its own copy:
// a caller's is often part of a larger one (a request line, query and
// all), which a kept record would otherwise hold whole.
func (r *Record) sanitize() {
	if i := strings.IndexAny(r.Path, "?#"); i >= 0 {
		r.Path = r.Path[:i]
	}
	r.Agent = bounded(r.Agent, MaxAgentLen)
	r.Host = bounded(r.Host, MaxHostLen)
	r.Target = bounded(r.Target, MaxHostLen+6)
	r.Method = bounded(r.Method, MaxMethodLen)
	r.Path = bounded(r.Path, MaxPathLen)
	r.Reason = bounded(r.Reason, MaxReasonLen)
	r.Rule = bounded(r.Rule, MaxRuleLen)
	r.Secret = bounded(r.Secret, MaxSecretLen)
	r.Tool = bounded(r.Tool, MaxToolLen)
	r.Relay = bounded(r.Relay, 16)
	if !validTraceParent(r.Trace) {
		r.Trace = ""
	}
	r.Kind = Kind(bounded(string(r.Kind), 16))
}

// bounded is s with its control characters escaped, cut to n bytes, in
// memory of its own.
func bounded(s string, n int) string {
	return strings.Clone(truncate(escapeControls(s), n))
}

// escapeControls writes control characters as Go escapes (\n, \x1b,
// \u0085): ASCII's and C1's, and the Unicode formatting characters that
// reorder or hide text around them (bidirectional overrides, isolates and
// marks; zero-width ones), which would let a path or a reason show a
// person other text than it holds. Bytes that are not UTF-8 are kept as
// they are. A string without any is returned as it is, without
// allocating.
func escapeControls(s string) string {
	i := strings.IndexFunc(s, isControl)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for s = s[i:]; s != ""; {
		c, size := utf8.DecodeRuneInString(s)
		switch {
		case c == utf8.RuneError && size == 1:
			b.WriteByte(s[0])
		case isControl(c):
			q := strconv.QuoteRune(c) // '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

// isControl says whether r is escaped: a C0 or C1 control, DEL, or a
// formatting character that changes how the text around it shows.
func isControl(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2060 && r <= 0x2069, r == 0xfeff:
		return true
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// AppendJSON appends the record as one JSON object (no newline).
func (r *Record) AppendJSON(b []byte) []byte {
	b = append(b, `{"`+FieldSeq+`":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"`+FieldTime+`":"`...)
	b = r.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	b = appendString(b, FieldAgent, r.Agent, true)
	b = appendString(b, FieldKind, string(r.Kind), true)
	b = appendString(b, FieldHost, r.Host, false)
	b = appendInt(b, FieldPort, int64(r.Port))
	if r.Addr.IsValid() {
		b = append(b, `,"`+FieldAddr+`":"`...)
		b = r.Addr.AppendTo(b)
		b = append(b, '"')
	}
	b = appendString(b, FieldTarget, r.Target, false)
	b = appendString(b, FieldMethod, r.Method, false)
	b = appendString(b, FieldPath, r.Path, false)
	b = appendInt(b, FieldStatus, int64(r.Status))
	b = appendInt(b, FieldAnswers, int64(r.Answers))
	b = append(b, `,"`+FieldAllowed+`":`...)
	b = strconv.AppendBool(b, r.Allowed)
	if r.Report {
		b = append(b, `,"`+FieldReport+`":true`...)
	}
	b = appendString(b, FieldReason, r.Reason, false)
	b = appendString(b, FieldRule, r.Rule, false)
	b = appendString(b, FieldSecret, r.Secret, false)
	b = appendString(b, FieldTool, r.Tool, false)
	b = appendString(b, FieldTrace, r.Trace, false)
	b = appendInt(b, FieldBytesUp, r.BytesUp)
	b = appendInt(b, FieldBytesDown, r.BytesDown)
	b = appendString(b, FieldRelay, r.Relay, false)
	if r.Duration != 0 {
		b = append(b, `,"`+FieldDuration+`":`...)
		b = strconv.AppendFloat(b, float64(r.Duration)/float64(time.Millisecond), 'f', -1, 64)
	}
	if r.Open {
		b = append(b, `,"`+FieldOpen+`":true`...)
	}
	if r.ConnID != 0 {
		b = append(b, `,"`+FieldConnID+`":`...)
		b = strconv.AppendUint(b, r.ConnID, 10)
	}
	if r.Count > 1 {
		b = append(b, `,"`+FieldCount+`":`...)
		b = strconv.AppendUint(b, r.Count, 10)
	}
	return append(b, '}')
}

func appendInt(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

func appendString(b []byte, key, v string, always bool) []byte {
	if v == "" && !always {
		return b
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return appendQuoted(b, v)
}

const hexDigits = "0123456789abcdef"

// appendQuoted appends s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 replaced by U+FFFD, and U+2028 and
// U+2029 escaped so that a line is always one record.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// jsonRecord is the JSON form, for parsing.
type jsonRecord struct {
	Seq       uint64   `json:"seq"`
	Time      string   `json:"time"`
	Agent     string   `json:"agent"`
	Kind      Kind     `json:"kind"`
	Host      string   `json:"host"`
	Port      uint16   `json:"port"`
	Addr      string   `json:"addr"`
	Target    string   `json:"target"`
	Method    string   `json:"method"`
	Path      string   `json:"path"`
	Status    int      `json:"status"`
	Answers   int      `json:"answers"`
	Allowed   *bool    `json:"allowed"`
	Report    bool     `json:"report"`
	Reason    string   `json:"reason"`
	Rule      string   `json:"rule"`
	Secret    string   `json:"secret"`
	Tool      string   `json:"tool"`
	Trace     string   `json:"traceparent"`
	BytesUp   int64    `json:"bytes_up"`
	BytesDown int64    `json:"bytes_down"`
	Relay     string   `json:"relay"`
	Duration  *float64 `json:"duration_ms"`
	Open      bool     `json:"open"`
	ConnID    uint64   `json:"conn"`
	Count     uint64   `json:"count"`
}

// ParseJSON parses one record in the form AppendJSON writes. A record
// without "allowed" is an error, never an allowed record.
func ParseJSON(line []byte) (Record, error) {
	var j jsonRecord
	if err := json.Unmarshal(line, &j); err != nil {
		return Record{}, fmt.Errorf("egresslog: parse record: %w", err)
	}
	if j.Allowed == nil {
		return Record{}, fmt.Errorf("egresslog: parse record: no %q field", FieldAllowed)
	}
	t, err := time.Parse(time.RFC3339Nano, j.Time)
	if err != nil {
		return Record{}, fmt.Errorf("egresslog: parse record: %w", err)
	}
	r := Record{
		Seq: j.Seq, Time: t, Agent: j.Agent, Kind: j.Kind, Host: j.Host, Port: j.Port, Target: j.Target,
		Method: j.Method, Path: j.Path, Status: j.Status, Answers: j.Answers,
		Allowed: *j.Allowed, Report: j.Report, Reason: j.Reason, Rule: j.Rule, Secret: j.Secret, Tool: j.Tool, Trace: j.Trace,
		BytesUp: j.BytesUp, BytesDown: j.BytesDown, Relay: j.Relay, Open: j.Open, ConnID: j.ConnID,
		Count: j.Count,
	}
	if j.Addr != "" {
		if r.Addr, err = netip.ParseAddrPort(j.Addr); err != nil {
			return Record{}, fmt.Errorf("egresslog: parse record: %w", err)
		}
	}
	if j.Duration != nil {
		ns := *j.Duration * float64(time.Millisecond)
		if math.IsNaN(ns) || ns > math.MaxInt64 || ns < math.MinInt64 {
			return Record{}, fmt.Errorf("egresslog: parse record: duration %v out of range", *j.Duration)
		}
		r.Duration = time.Duration(math.Round(ns))
	}
	return r, nil
}

// validTraceParent reports whether s is a W3C traceparent of version 00:
// "00-" 32 hex digits of trace ID "-" 16 of parent ID "-" 2 of flags,
// lowercase, neither ID all zeros.
func validTraceParent(s string) bool {
	if len(s) != 55 || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return false
	}
	traceID, parentID, flags := s[3:35], s[36:52], s[53:]
	return lowerHex(traceID) && lowerHex(parentID) && lowerHex(flags) &&
		strings.Trim(traceID, "0") != "" && strings.Trim(parentID, "0") != ""
}

func lowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
