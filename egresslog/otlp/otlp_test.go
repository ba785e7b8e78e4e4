package otlp

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agenthold/egress/egresslog"
)

// receiver is an OTLP/HTTP logs receiver built on the official OTLP
// protobuf definitions: it keeps the log records it is sent.
type receiver struct {
	mu      sync.Mutex
	records []*logspb.LogRecord
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req collogs.ExportLogsServiceRequest
	if err != nil || r.URL.Path != "/v1/logs" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP logs export", http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	for _, rl := range req.ResourceLogs {
		for _, sl := range rl.ScopeLogs {
			rc.records = append(rc.records, sl.LogRecords...)
		}
	}
	rc.mu.Unlock()
	out, _ := proto.Marshal(&collogs.ExportLogsServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func attrs(r *logspb.LogRecord) map[string]any {
	out := map[string]any{}
	for _, kv := range r.Attributes {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.Key] = v.StringValue
		case *commonpb.AnyValue_BoolValue:
			out[kv.Key] = v.BoolValue
		case *commonpb.AnyValue_IntValue:
			out[kv.Key] = v.IntValue
		}
	}
	return out
}

// TestRecordsArriveAsOTLPLogs: records a Log writes reach a real OTLP
// receiver with their fields as the conventions name them, and the
// secret's name, never more.
func TestRecordsArriveAsOTLPLogs(t *testing.T) {
	rc := &receiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	sink, err := New(t.Context(), otlploghttp.WithEndpointURL(srv.URL+"/v1/logs"))
	require.NoError(t, err)
	l := &egresslog.Log{Sinks: []egresslog.Sink{sink}}
	now := time.Now()
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindHTTP, Host: "api.github.com", Port: 443, Method: "POST",
		Path: "/repos/acme/widgets/issues", Status: 201, Allowed: true, Reason: "allowed by rule", Rule: "api.github.com", Secret: "github"})
	l.Record(egresslog.Record{Time: now, Agent: "a1", Kind: egresslog.KindTLS, Host: "pastebin.com", Port: 443, Reason: "a deny entry matches", Rule: "!pastebin.com"})
	require.NoError(t, l.Shutdown(t.Context()), "the Log closes its sinks, which exports what is batched")

	rc.mu.Lock()
	defer rc.mu.Unlock()
	require.Len(t, rc.records, 2)
	got := map[string]map[string]any{}
	for _, r := range rc.records {
		a := attrs(r)
		got[a["server.address"].(string)] = a
	}
	api := got["api.github.com"]
	assert.Equal(t, "a1", api["egress.agent"])
	assert.Equal(t, "POST", api["http.request.method"])
	assert.Equal(t, "/repos/acme/widgets/issues", api["url.path"])
	assert.EqualValues(t, 201, api["http.response.status_code"])
	assert.EqualValues(t, 443, api["server.port"])
	assert.Equal(t, true, api["egress.allowed"])
	assert.Equal(t, "github", api["egress.secret"])
	denied := got["pastebin.com"]
	assert.Equal(t, false, denied["egress.allowed"])
	assert.Equal(t, "a deny entry matches", denied["egress.reason"])
	assert.Equal(t, "!pastebin.com", denied["egress.rule"])
}

// BenchmarkBlackHole: a Log's records with the sink pointed at a
// collector that accepts connections and never answers, against the same
// Log without it: the data path (Log.Record) pays nothing for a
// collector that is down.
func BenchmarkBlackHole(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	sink, err := New(b.Context(), otlploghttp.WithEndpointURL("http://"+ln.Addr().String()+"/v1/logs"), otlploghttp.WithTimeout(time.Second), otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false}))
	require.NoError(b, err)
	r := egresslog.Record{Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true, Reason: "allowed by rule"}
	for _, tc := range []struct {
		name  string
		sinks []egresslog.Sink
	}{{"without", nil}, {"black-hole", []egresslog.Sink{sink}}} {
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
