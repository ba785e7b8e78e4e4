// Package otlptest is an OTLP receiver for tests, built on the official
// OTLP protobuf definitions, over HTTP and gRPC: it keeps what it is
// sent, and the headers it came with.
package otlptest

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Receiver keeps what it is sent. Lock Mu to read its fields.
type Receiver struct {
	collogs.UnimplementedLogsServiceServer
	colmetrics.UnimplementedMetricsServiceServer
	coltrace.UnimplementedTraceServiceServer

	Mu       sync.Mutex
	Logs     []*logspb.LogRecord
	Services []string                     // service.name of each export's resource
	Metrics  map[string]*metricspb.Metric // the last of each name
	Spans    []*tracepb.Span
	Headers  []map[string]string // of each export, lowercase names
}

// New returns an empty receiver.
func New() *Receiver { return &Receiver{Metrics: map[string]*metricspb.Metric{}} }

func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	headers := map[string]string{}
	for k := range r.Header {
		headers[strings.ToLower(k)] = r.Header.Get(k) // not a name: a header's, as gRPC metadata spells it
	}
	var reply proto.Message
	switch r.URL.Path {
	case "/v1/logs":
		var req collogs.ExportLogsServiceRequest
		if err = proto.Unmarshal(body, &req); err == nil {
			reply, _ = rc.Export(metadata.NewIncomingContext(r.Context(), metadata.New(headers)), &req)
		}
	case "/v1/metrics":
		var req colmetrics.ExportMetricsServiceRequest
		if err = proto.Unmarshal(body, &req); err == nil {
			reply, _ = rc.exportMetrics(headers, &req)
		}
	case "/v1/traces":
		var req coltrace.ExportTraceServiceRequest
		if err = proto.Unmarshal(body, &req); err == nil {
			reply, _ = rc.exportTraces(headers, &req)
		}
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, "not an OTLP export", http.StatusBadRequest)
		return
	}
	out, _ := proto.Marshal(reply)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// Export receives logs over gRPC (and over HTTP, through it).
func (rc *Receiver) Export(ctx context.Context, req *collogs.ExportLogsServiceRequest) (*collogs.ExportLogsServiceResponse, error) {
	rc.Mu.Lock()
	defer rc.Mu.Unlock()
	rc.Headers = append(rc.Headers, incoming(ctx))
	for _, rl := range req.ResourceLogs {
		rc.Services = append(rc.Services, serviceName(rl.Resource.GetAttributes()))
		for _, sl := range rl.ScopeLogs {
			rc.Logs = append(rc.Logs, sl.LogRecords...)
		}
	}
	return &collogs.ExportLogsServiceResponse{}, nil
}

func (rc *Receiver) exportMetrics(headers map[string]string, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	rc.Mu.Lock()
	defer rc.Mu.Unlock()
	rc.Headers = append(rc.Headers, headers)
	for _, rm := range req.ResourceMetrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				rc.Metrics[m.Name] = m
			}
		}
	}
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

func (rc *Receiver) exportTraces(headers map[string]string, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	rc.Mu.Lock()
	defer rc.Mu.Unlock()
	rc.Headers = append(rc.Headers, headers)
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			rc.Spans = append(rc.Spans, ss.Spans...)
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// metricsServer and traceServer give the receiver's methods the names
// the gRPC services want, beside the logs service's Export.
type metricsServer struct {
	colmetrics.UnimplementedMetricsServiceServer
	rc *Receiver
}

func (m metricsServer) Export(ctx context.Context, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	return m.rc.exportMetrics(incoming(ctx), req)
}

type traceServer struct {
	coltrace.UnimplementedTraceServiceServer
	rc *Receiver
}

func (s traceServer) Export(ctx context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	return s.rc.exportTraces(incoming(ctx), req)
}

// ServeHTTPOn serves the receiver over OTLP/HTTP on ln until the test
// ends, and returns its base URL.
func (rc *Receiver) ServeHTTPOn(t testing.TB, ln net.Listener) string {
	srv := &http.Server{Handler: rc}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// ServeGRPCOn serves the receiver over OTLP/gRPC on ln until the test
// ends, and returns its base URL.
func (rc *Receiver) ServeGRPCOn(t testing.TB, ln net.Listener) string {
	srv := grpc.NewServer()
	collogs.RegisterLogsServiceServer(srv, rc)
	colmetrics.RegisterMetricsServiceServer(srv, metricsServer{rc: rc})
	coltrace.RegisterTraceServiceServer(srv, traceServer{rc: rc})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return "http://" + ln.Addr().String()
}

// incoming is a gRPC request's metadata as a header map.
func incoming(ctx context.Context) map[string]string {
	md, _ := metadata.FromIncomingContext(ctx)
	out := map[string]string{}
	for k, v := range md {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}

func serviceName(attrs []*commonpb.KeyValue) string {
	for _, kv := range attrs {
		if kv.Key == "service.name" {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// Attrs is an attribute list as a map of plain values.
func Attrs(kvs []*commonpb.KeyValue) map[string]any {
	out := map[string]any{}
	for _, kv := range kvs {
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
