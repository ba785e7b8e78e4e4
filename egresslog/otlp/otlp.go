// Package otlp sends egress records to an OpenTelemetry pipeline, as OTLP
// log records over HTTP, with the official SDK: an egresslog.Sink, so
// that a Log ships its records in one line.
//
// A record's fields become attributes named after OpenTelemetry's
// semantic conventions where they have one (server.address, server.port,
// http.request.method, url.path, http.response.status_code) and egress.*
// otherwise (egress.agent, egress.kind, egress.allowed, egress.reason,
// egress.rule, egress.secret, which is a secret's name, never a value,
// egress.tool). The exporter's endpoint and headers come from the
// standard OTEL_EXPORTER_OTLP_* variables, or from the options given.
//
// Nothing waits for the pipeline: the Log hands records to its sinks from
// a goroutine of its own and drops them when its queue is full, and the
// SDK's batch processor drops the oldest when its own is: a collector
// that is down or slow costs the data path nothing.
package otlp

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"

	"github.com/agenthold/egress/egresslog"
)

// Sink emits each record as an OTLP log record.
type Sink struct {
	provider *sdklog.LoggerProvider
	logger   log.Logger
}

// New returns a sink that exports over OTLP/HTTP, configured by opts and
// the OTEL_EXPORTER_OTLP_* variables.
func New(ctx context.Context, opts ...otlploghttp.Option) (*Sink, error) {
	exp, err := otlploghttp.New(ctx, opts...)
	if err != nil {
		return nil, err
	}
	provider := sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(exp)))
	return &Sink{provider: provider, logger: provider.Logger("github.com/agenthold/egress/egresslog")}, nil
}

// WriteRecord implements egresslog.Sink.
func (s *Sink) WriteRecord(r *egresslog.Record) error {
	var rec log.Record
	rec.SetTimestamp(r.Time)
	rec.SetObservedTimestamp(time.Now())
	if r.Allowed && !r.Report {
		rec.SetSeverity(log.SeverityInfo)
		rec.SetSeverityText("INFO")
	} else {
		rec.SetSeverity(log.SeverityWarn)
		rec.SetSeverityText("WARN")
	}
	rec.SetEventName("egress." + string(r.Kind))
	rec.SetBody(attribute.StringValue(r.Reason))
	attrs := []attribute.KeyValue{
		attribute.String("egress.agent", r.Agent),
		attribute.String("egress.kind", string(r.Kind)),
		attribute.Bool("egress.allowed", r.Allowed),
		attribute.String("egress.reason", r.Reason),
		attribute.String("server.address", r.Host),
	}
	if r.Port != 0 {
		attrs = append(attrs, attribute.Int("server.port", int(r.Port)))
	}
	for _, kv := range []struct{ key, value string }{
		{"http.request.method", r.Method}, {"url.path", r.Path}, {"egress.rule", r.Rule},
		{"egress.secret", r.Secret}, {"egress.tool", r.Tool},
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
	rec.AddAttributes(attrs...)
	s.logger.Emit(context.Background(), rec)
	return nil
}

// Flush implements egresslog.Sink. The batch processor exports on its own
// schedule; Flush does not wait for the pipeline.
func (s *Sink) Flush() error { return nil }

// Close exports what is batched, waiting at most 5 s for the pipeline,
// and stops the exporter. A Log closes its sinks when it stops.
func (s *Sink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.provider.Shutdown(ctx)
}
