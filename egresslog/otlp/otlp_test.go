package otlp

import (
	"context"
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/otlptest"
)

const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
)

// record writes what a gateway records for three HTTP requests (one in
// the agent's sampled trace, one in its unsampled trace, one without a
// trace) and a denied TLS connection.
func record(l *egresslog.Log) {
	now := time.Now()
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindHTTP, Host: "api.github.com", Port: 443, Method: "POST",
		Path: "/repos/acme/widgets/issues", Status: 201, Allowed: true, Reason: "allowed by rule", Rule: "api.github.com", Secret: "github",
		BytesUp: 300, BytesDown: 700, Duration: 40 * time.Millisecond, Trace: "00-" + parentTrace + "-" + parentSpan + "-01"})
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindHTTP, Host: "unsampled.example", Port: 443, Method: "GET",
		Path: "/", Status: 200, Allowed: true, Reason: "allowed by rule", Trace: "00-" + parentTrace + "-" + parentSpan + "-00"})
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindHTTP, Host: "untraced.example", Port: 80, Method: "DELETE",
		Path: "/x", Status: 403, Reason: "no request entry allows the method and path"})
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindTLS, Host: "pastebin.com", Port: 443, Reason: "a deny entry matches", Rule: "!pastebin.com"})
}

// TestSignalsArrive: records, spans and metrics reach a real OTLP
// receiver, over HTTP and over gRPC, with their fields as the
// conventions name them, the secret's name and never more, the headers
// and service name configured; each HTTP request's span is the child of
// the agent's span, sampled or not, or a root.
func TestSignalsArrive(t *testing.T) {
	for _, protocol := range []string{ProtocolHTTP, ProtocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			rc := otlptest.New()
			var endpoint string
			if protocol == ProtocolGRPC {
				endpoint = rc.ServeGRPCOn(t, listen(t))
			} else {
				endpoint = rc.ServeHTTPOn(t, listen(t))
			}
			s := Settings{Protocol: protocol, Endpoint: endpoint, Headers: map[string]string{"x-api-key": "k1"}, ServiceName: "egress-test", Interval: time.Hour}
			logs, err := NewLogs(t.Context(), s)
			require.NoError(t, err)
			spans, err := NewTraces(t.Context(), s)
			require.NoError(t, err)
			l := &egresslog.Log{Sinks: []egresslog.Sink{logs, spans}}
			metrics, err := NewMetrics(t.Context(), s, l)
			require.NoError(t, err)
			record(l)
			require.NoError(t, l.Shutdown(t.Context()), "the Log closes its sinks, which exports what is batched")
			require.NoError(t, metrics.Close(), "closing exports the counters once more")

			rc.Mu.Lock()
			defer rc.Mu.Unlock()
			for _, h := range rc.Headers {
				assert.Equal(t, "k1", h["x-api-key"], "an export without the configured header")
			}
			assert.Contains(t, rc.Services, "egress-test")
			checkLogs(t, rc)
			checkSpans(t, rc)
			checkMetrics(t, rc)
			assert.Equal(t, Stats{}, logs.Stats())
			assert.Equal(t, Stats{}, spans.Stats())
		})
	}
}

func checkLogs(t *testing.T, rc *otlptest.Receiver) {
	require.Len(t, rc.Logs, 4)
	got := map[string]map[string]any{}
	for _, r := range rc.Logs {
		a := otlptest.Attrs(r.Attributes)
		got[a["server.address"].(string)] = a
	}
	api := got["api.github.com"]
	assert.Equal(t, "a1", api["egress.agent"])
	assert.Equal(t, "POST", api["http.request.method"])
	assert.Equal(t, "/repos/acme/widgets/issues", api["url.path"])
	assert.EqualValues(t, 201, api["http.response.status_code"])
	assert.EqualValues(t, 443, api["server.port"])
	assert.Equal(t, true, api["egress.allowed"])
	assert.Equal(t, "allowed by rule", api["egress.reason"])
	assert.Equal(t, "api.github.com", api["egress.rule"])
	assert.Equal(t, "github", api["egress.secret"])
	denied := got["pastebin.com"]
	assert.Equal(t, false, denied["egress.allowed"])
	assert.Equal(t, "a deny entry matches", denied["egress.reason"])
	assert.Equal(t, "!pastebin.com", denied["egress.rule"])
	assert.NotContains(t, denied, "http.response.status_code", "a TLS record has no HTTP status")
}

func checkSpans(t *testing.T, rc *otlptest.Receiver) {
	require.Len(t, rc.Spans, 3, "a span for each HTTP record, none for the TLS connection")
	byHost := map[string]*tracepb.Span{}
	for _, s := range rc.Spans {
		byHost[otlptest.Attrs(s.Attributes)["server.address"].(string)] = s
	}
	for _, host := range []string{"api.github.com", "unsampled.example"} {
		s := byHost[host]
		require.NotNil(t, s, host)
		assert.Equal(t, parentTrace, hex.EncodeToString(s.TraceId), "%s: the span is in the agent's trace", host)
		assert.Equal(t, parentSpan, hex.EncodeToString(s.ParentSpanId), "%s: the agent's span is its parent", host)
	}
	api := byHost["api.github.com"]
	assert.Equal(t, "POST api.github.com", api.Name)
	assert.Equal(t, tracepb.Span_SPAN_KIND_SERVER, api.Kind)
	assert.Equal(t, uint64(40*time.Millisecond), api.EndTimeUnixNano-api.StartTimeUnixNano, "the span lasts as long as the request")
	a := otlptest.Attrs(api.Attributes)
	assert.Equal(t, "github", a["egress.secret"])
	assert.Equal(t, "/repos/acme/widgets/issues", a["url.path"])
	assert.EqualValues(t, 201, a["http.response.status_code"])
	assert.NotEqual(t, tracepb.Status_STATUS_CODE_ERROR, api.GetStatus().GetCode())

	untraced := byHost["untraced.example"]
	require.NotNil(t, untraced)
	assert.Empty(t, untraced.ParentSpanId, "a request without a traceparent starts a trace")
	assert.NotEqual(t, parentTrace, hex.EncodeToString(untraced.TraceId))
	assert.Equal(t, tracepb.Status_STATUS_CODE_ERROR, untraced.GetStatus().GetCode(), "a refused request's span is an error")
	assert.Equal(t, "no request entry allows the method and path", untraced.GetStatus().GetMessage())
}

func checkMetrics(t *testing.T, rc *otlptest.Receiver) {
	sum := func(name string, match map[string]any) int64 {
		m := rc.Metrics[name]
		require.NotNil(t, m, "metric %s", name)
		require.NotNil(t, m.GetSum(), "%s is a sum", name)
		assert.True(t, m.GetSum().IsMonotonic, "%s is a counter", name)
	points:
		for _, p := range m.GetSum().DataPoints {
			a := otlptest.Attrs(p.Attributes)
			for k, v := range match {
				if a[k] != v {
					continue points
				}
			}
			return p.GetAsInt()
		}
		t.Errorf("%s: no point with %v", name, match)
		return -1
	}
	assert.EqualValues(t, 4, sum("egress.records", map[string]any{"egress.agent": "a1"}))
	assert.EqualValues(t, 1, sum("egress.denied", map[string]any{"egress.agent": "a1", "egress.reason": "a deny entry matches"}))
	assert.EqualValues(t, 1, sum("egress.injected", map[string]any{"egress.agent": "a1"}))
	assert.EqualValues(t, 300, sum("egress.bytes", map[string]any{"egress.agent": "a1", "egress.direction": "up"}))
	assert.EqualValues(t, 700, sum("egress.bytes", map[string]any{"egress.agent": "a1", "egress.direction": "down"}))
	assert.EqualValues(t, 0, sum("egress.log.sink.failures", nil))
}

// TestSettingsFromTheEnvironment: with nothing configured, the standard
// variables choose the protocol, endpoint, headers and service name.
func TestSettingsFromTheEnvironment(t *testing.T) {
	rc := otlptest.New()
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.ServeGRPCOn(t, listen(t)))
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=from-env")
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	logs, err := NewLogs(t.Context(), Settings{ServiceName: "the variable wins"})
	require.NoError(t, err)
	l := &egresslog.Log{Sinks: []egresslog.Sink{logs}}
	record(l)
	require.NoError(t, l.Shutdown(t.Context()))
	rc.Mu.Lock()
	defer rc.Mu.Unlock()
	assert.Len(t, rc.Logs, 4)
	require.NotEmpty(t, rc.Headers)
	assert.Equal(t, "from-env", rc.Headers[0]["x-api-key"])
	assert.Equal(t, []string{"from-env"}, rc.Services)
}

// TestBadSettingsRefused: a protocol the SDK cannot speak or an endpoint
// that is not a URL is an error at start, never a sink that sends
// nowhere.
func TestBadSettingsRefused(t *testing.T) {
	for _, s := range []Settings{
		{Protocol: "http/json"},
		{Protocol: "udp"},
		{Endpoint: "collector:4317"},
		{Endpoint: "ftp://collector"},
	} {
		_, err := NewLogs(t.Context(), s)
		assert.Error(t, err, "logs %+v", s)
		_, err = NewTraces(t.Context(), s)
		assert.Error(t, err, "traces %+v", s)
		_, err = NewMetrics(t.Context(), s, &egresslog.Log{})
		assert.Error(t, err, "metrics %+v", s)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/json")
	_, err := NewLogs(t.Context(), Settings{})
	assert.Error(t, err, "a protocol from the environment is checked too")
}

func listen(t testing.TB) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

// blackHole accepts connections and never answers; it returns the URL.
func blackHole(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return "http://" + ln.Addr().String()
}

// TestCollectorDownDropsAreCounted: with the collector not answering, a
// sink holds at most its queue's worth and drops the rest itself,
// counted by the sink and by the Log; the exports that time out are
// counted as failed.
func TestCollectorDownDropsAreCounted(t *testing.T) {
	const queue, records = 8, 100
	s := Settings{Endpoint: blackHole(t), QueueSize: queue, Timeout: 200 * time.Millisecond}
	logs, err := NewLogs(t.Context(), s)
	require.NoError(t, err)
	l := &egresslog.Log{Sinks: []egresslog.Sink{logs}}
	for range records {
		l.Record(egresslog.Record{Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true})
	}
	require.NoError(t, l.Flush(t.Context()))
	st := logs.Stats()
	assert.GreaterOrEqual(t, st.Dropped, uint64(records-2*queue), "the sink held more than its queue")
	_, failedWrites := l.SinkStats()
	assert.Equal(t, st.Dropped, failedWrites, "the Log counts each dropped record")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l.Shutdown(ctx)
	assert.Positive(t, logs.Stats().Failed, "exports to a collector that never answers fail, and are counted")
	assert.LessOrEqual(t, logs.Stats().Dropped+logs.Stats().Failed, uint64(records))
}

// BenchmarkBlackHole: a Log's records with the logs and traces sinks
// pointed at a collector that accepts connections and never answers,
// against the same Log without them: Log.Record pays nothing for a
// collector that is down. (mitm's BenchmarkTelemetryBlackHole measures
// the same on intercepted requests.)
func BenchmarkBlackHole(b *testing.B) {
	s := Settings{Endpoint: blackHole(b), Timeout: time.Second}
	logs, err := NewLogs(b.Context(), s)
	require.NoError(b, err)
	spans, err := NewTraces(b.Context(), s)
	require.NoError(b, err)
	r := egresslog.Record{Agent: "a1", Kind: egresslog.KindHTTP, Host: "api.github.com", Port: 443, Method: "GET", Path: "/", Allowed: true, Reason: "allowed by rule"}
	for _, tc := range []struct {
		name  string
		sinks []egresslog.Sink
	}{{"without", nil}, {"black-hole", []egresslog.Sink{logs, spans}}} {
		b.Run(tc.name, func(b *testing.B) {
			l := &egresslog.Log{Sinks: tc.sinks}
			for b.Loop() {
				l.Record(r)
			}
			b.StopTimer()
			l.Close()
		})
	}
}

// TestNamesTheAgentCannotMultiply: a span's name holds only a known
// method and the policy entry that allowed the request, never a method or
// a host the agent made up; what the agent sent stays in attributes, and
// a DNS query type is not called an HTTP method.
func TestNamesTheAgentCannotMultiply(t *testing.T) {
	rc := otlptest.New()
	s := Settings{Protocol: ProtocolHTTP, Endpoint: rc.ServeHTTPOn(t, listen(t)), Interval: time.Hour}
	logs, err := NewLogs(t.Context(), s)
	require.NoError(t, err)
	spans, err := NewTraces(t.Context(), s)
	require.NoError(t, err)
	l := &egresslog.Log{Sinks: []egresslog.Sink{logs, spans}}
	now := time.Now()
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindHTTP, Host: "x7f3a.evil.test", Port: 80, Method: "EXFIL-7f3a",
		Path: "/", Status: 403, Reason: "no entry matches"})
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindHTTP, Host: "b81c.example.com", Port: 443, Method: "GET",
		Path: "/", Status: 200, Allowed: true, Reason: "allowed by rule", Rule: "*.example.com"})
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindDNS, Host: "c9d2.example.com", Method: "TXT",
		Allowed: true, Reason: "allowed by rule", Rule: "*.example.com"})
	require.NoError(t, l.Shutdown(t.Context()))

	rc.Mu.Lock()
	defer rc.Mu.Unlock()
	var names []string
	for _, s := range rc.Spans {
		names = append(names, s.Name)
	}
	assert.ElementsMatch(t, []string{"HTTP", "GET *.example.com"}, names, "span names")
	require.Len(t, rc.Logs, 3)
	byHost := map[string]map[string]any{}
	for _, r := range rc.Logs {
		a := otlptest.Attrs(r.Attributes)
		byHost[a["server.address"].(string)] = a
	}
	made := byHost["x7f3a.evil.test"]
	assert.Equal(t, "_OTHER", made["http.request.method"])
	assert.Equal(t, "EXFIL-7f3a", made["http.request.method_original"])
	assert.Equal(t, "GET", byHost["b81c.example.com"]["http.request.method"])
	assert.NotContains(t, byHost["b81c.example.com"], "http.request.method_original")
	dns := byHost["c9d2.example.com"]
	assert.Equal(t, "TXT", dns["egress.dns.type"])
	assert.NotContains(t, dns, "http.request.method", "a DNS query type as an HTTP method")
}
