// Package otlp sends egress records and counters to an OpenTelemetry
// pipeline with the official SDK, over OTLP/HTTP or OTLP/gRPC:
//
//   - NewLogs: every record as an OTLP log record (an egresslog.Sink);
//   - NewTraces: a span for every HTTP request the gateway judged one by
//     one (intercepted, or plain HTTP), a child of the span the agent's
//     own traceparent named, so the gateway hop shows inside the agent's
//     trace (an egresslog.Sink);
//   - NewMetrics: a Log's counters as OTLP metrics.
//
// A record's fields become attributes named after OpenTelemetry's
// semantic conventions where they have one (server.address, server.port,
// http.request.method, url.path, http.response.status_code) and egress.*
// otherwise (egress.agent, egress.kind, egress.allowed, egress.reason,
// egress.rule, egress.secret, which is a secret's name, never a value,
// egress.tool, egress.dns.type). A span's name holds a known method and
// the entry that allowed the request, never what the agent made up. attributes is the one place that names them, for logs and
// spans alike.
//
// Where the signals go: Settings, whose zero fields leave it to the
// standard OTEL_EXPORTER_OTLP_* variables (endpoint, headers, protocol,
// per signal or for all), which the SDK's exporters read.
//
// Nothing waits for the pipeline. The Log hands records to its sinks from
// a goroutine of its own, and a sink hands them to the SDK's batch
// processor, which exports in the background. Each sink bounds what it
// has handed over and not yet seen exported (Settings.QueueSize): beyond
// it, a record is dropped by the sink and counted (Stats, and the Log's
// own count of failed writes), never by the SDK unseen. A collector that
// is down or slow costs the data path nothing.
package otlp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/agenthold/egress/egresslog"
)

// The protocols of Settings.Protocol, as OTEL_EXPORTER_OTLP_PROTOCOL
// names them.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Defaults of Settings.
const (
	DefaultQueueSize = 2048
	DefaultTimeout   = 10 * time.Second
)

// Settings say where the signals go and how much may wait for the
// collector. A zero field leaves the choice to the standard variables.
type Settings struct {
	// Protocol is ProtocolHTTP or ProtocolGRPC. Empty:
	// OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL, then
	// OTEL_EXPORTER_OTLP_PROTOCOL, then HTTP. Any other value is an error.
	Protocol string
	// Endpoint is the collector's base URL, "http://collector:4318" for
	// HTTP (the signal's path, /v1/logs, is added) or
	// "http://collector:4317" for gRPC; its scheme says whether TLS is
	// used. Empty: OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT, then
	// OTEL_EXPORTER_OTLP_ENDPOINT, then localhost.
	Endpoint string
	// Headers are sent with every export (an API key). Nil:
	// OTEL_EXPORTER_OTLP_<SIGNAL>_HEADERS, then OTEL_EXPORTER_OTLP_HEADERS.
	Headers map[string]string
	// ServiceName is the resource's service.name, unless
	// OTEL_SERVICE_NAME says otherwise.
	ServiceName string
	// QueueSize bounds the records (or spans) a sink holds for export;
	// zero means DefaultQueueSize.
	QueueSize int
	// Timeout bounds one export; zero means DefaultTimeout.
	Timeout time.Duration
	// Interval is how often metrics are exported. Zero:
	// OTEL_METRIC_EXPORT_INTERVAL, then 60 s.
	Interval time.Duration
}

// protocol is the protocol for signal ("LOGS", "METRICS", "TRACES").
func (s Settings) protocol(signal string) (string, error) {
	p := s.Protocol
	if p == "" {
		p = os.Getenv("OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL")
	}
	if p == "" {
		p = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch p {
	case "", ProtocolHTTP:
		return ProtocolHTTP, nil
	case ProtocolGRPC:
		return ProtocolGRPC, nil
	}
	return "", fmt.Errorf("otlp: protocol %q: want %q or %q", p, ProtocolHTTP, ProtocolGRPC)
}

// target is the protocol and endpoint URL of signal's exporter ("" to
// leave the endpoint to the variables), whose HTTP path is path.
func (s Settings) target(signal, path string) (protocol, endpoint string, err error) {
	if protocol, err = s.protocol(signal); err != nil {
		return "", "", err
	}
	endpoint, err = s.endpointURL(protocol, path)
	return protocol, endpoint, err
}

// endpointURL is the URL for the exporter of a signal whose HTTP path is
// path, or "" to leave it to the variables.
func (s Settings) endpointURL(protocol, path string) (string, error) {
	if s.Endpoint == "" {
		return "", nil
	}
	u, err := url.Parse(s.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("otlp: endpoint %q: want http:// or https:// and a host", s.Endpoint)
	}
	if protocol == ProtocolHTTP {
		u.Path = strings.TrimSuffix(u.Path, "/") + path
	}
	return u.String(), nil
}

func (s Settings) queueSize() int {
	if s.QueueSize > 0 {
		return s.QueueSize
	}
	return DefaultQueueSize
}

func (s Settings) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return DefaultTimeout
}

// resource names this process to the collector: service.name from
// OTEL_SERVICE_NAME, then ServiceName, then "unknown_service:" and the
// program's name, as the specification has it; more attributes from
// OTEL_RESOURCE_ATTRIBUTES.
func (s Settings) resource() (*resource.Resource, error) {
	name := s.ServiceName
	if name == "" {
		name = "unknown_service:" + filepath.Base(os.Args[0])
	}
	return resource.New(context.Background(), resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", name)), resource.WithFromEnv())
}

// ErrQueueFull is what a sink's WriteRecord returns for a record it
// dropped because as many as Settings.QueueSize still wait for the
// collector; the Log counts it as a failed write.
var ErrQueueFull = errors.New("otlp: export queue full, record dropped")

// Stats count what a sink did not deliver.
type Stats struct {
	Dropped uint64 // records dropped because the queue was full
	Failed  uint64 // records in exports that failed (collector down, refused, timed out)
}

// queue counts what a sink has handed to the SDK and not yet seen
// exported, so that the SDK's own queue, sized to the same bound, never
// fills and drops records unseen: the sink drops them first, and counts.
type queue struct {
	limit           int64
	held            atomic.Int64
	dropped, failed atomic.Uint64
}

// take reserves room for one record, or counts it dropped.
func (q *queue) take() bool {
	if q.held.Add(1) > q.limit {
		q.held.Add(-1)
		q.dropped.Add(1)
		return false
	}
	return true
}

// done releases n records an export has finished with.
func (q *queue) done(n int, err error) {
	q.held.Add(-int64(n))
	if err != nil {
		q.failed.Add(uint64(n))
	}
}

func (q *queue) stats() Stats { return Stats{Dropped: q.dropped.Load(), Failed: q.failed.Load()} }

// httpMethod is an HTTP method as the conventions name it: one of the
// methods they know, or "_OTHER" (the agent chooses the method, and a
// name that holds what the agent chose is not one a backend can index).
func httpMethod(m string) (string, bool) {
	switch m {
	case http.MethodConnect, http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
		http.MethodPatch, http.MethodPost, http.MethodPut, http.MethodTrace, "QUERY":
		return m, true
	}
	return "_OTHER", false
}

// attributes are a record's fields as OpenTelemetry attributes.
func attributes(r *egresslog.Record) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		attribute.String("egress.agent", r.Agent),
		attribute.String("egress.kind", string(r.Kind)),
		attribute.Bool("egress.allowed", r.Allowed),
		attribute.String("egress.reason", r.Reason),
		attribute.String("server.address", r.Host),
	)
	if r.Port != 0 {
		attrs = append(attrs, attribute.Int("server.port", int(r.Port)))
	}
	switch {
	case r.Kind == egresslog.KindHTTP && r.Method != "":
		m, known := httpMethod(r.Method)
		attrs = append(attrs, attribute.String("http.request.method", m))
		if !known {
			attrs = append(attrs, attribute.String("http.request.method_original", r.Method))
		}
	case r.Kind == egresslog.KindDNS && r.Method != "":
		attrs = append(attrs, attribute.String("egress.dns.type", r.Method))
	}
	for _, kv := range []struct{ key, value string }{
		{"url.path", r.Path}, {"egress.rule", r.Rule},
		{"egress.secret", r.Secret}, {"egress.tool", r.Tool}, {"egress.relay", r.Relay},
	} {
		if kv.value != "" {
			attrs = append(attrs, attribute.String(kv.key, kv.value))
		}
	}
	if r.Kind == egresslog.KindHTTP && r.Status != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", r.Status))
	}
	if r.Report {
		attrs = append(attrs, attribute.Bool("egress.report", true))
	}
	return attrs
}
