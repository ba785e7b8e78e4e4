package otlp

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"

	"github.com/agenthold/egress/egresslog"
)

// LogSink emits each record as an OTLP log record.
type LogSink struct {
	provider *sdklog.LoggerProvider
	logger   log.Logger
	q        *queue
}

// NewLogs returns a sink that exports records as OTLP log records.
func NewLogs(ctx context.Context, s Settings) (*LogSink, error) {
	exp, err := newLogExporter(ctx, s)
	if err != nil {
		return nil, err
	}
	res, err := s.resource()
	if err != nil {
		return nil, err
	}
	q := &queue{limit: int64(s.queueSize())}
	provider := sdklog.NewLoggerProvider(sdklog.WithResource(res), sdklog.WithProcessor(sdklog.NewBatchProcessor(
		&countedLogs{Exporter: exp, q: q},
		sdklog.WithMaxQueueSize(s.queueSize()), sdklog.WithExportMaxBatchSize(min(512, s.queueSize())),
		sdklog.WithExportTimeout(s.timeout()))))
	return &LogSink{provider: provider, logger: provider.Logger("github.com/agenthold/egress/egresslog"), q: q}, nil
}

func newLogExporter(ctx context.Context, s Settings) (sdklog.Exporter, error) {
	protocol, endpoint, err := s.target("LOGS", "/v1/logs")
	if err != nil {
		return nil, err
	}
	if protocol == ProtocolGRPC {
		opts := []otlploggrpc.Option{otlploggrpc.WithTimeout(s.timeout())}
		if endpoint != "" {
			opts = append(opts, otlploggrpc.WithEndpointURL(endpoint))
		}
		if s.Headers != nil {
			opts = append(opts, otlploggrpc.WithHeaders(s.Headers))
		}
		return otlploggrpc.New(ctx, opts...)
	}
	opts := []otlploghttp.Option{otlploghttp.WithTimeout(s.timeout())}
	if endpoint != "" {
		opts = append(opts, otlploghttp.WithEndpointURL(endpoint))
	}
	if s.Headers != nil {
		opts = append(opts, otlploghttp.WithHeaders(s.Headers))
	}
	return otlploghttp.New(ctx, opts...)
}

// countedLogs releases the sink's queue as exports finish.
type countedLogs struct {
	sdklog.Exporter
	q *queue
}

func (c *countedLogs) Export(ctx context.Context, records []sdklog.Record) error {
	err := c.Exporter.Export(ctx, records)
	c.q.done(len(records), err)
	return err
}

// WriteRecord implements egresslog.Sink.
func (s *LogSink) WriteRecord(r *egresslog.Record) error {
	if !s.q.take() {
		return ErrQueueFull
	}
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
	rec.AddAttributes(attributes(r)...)
	s.logger.Emit(context.Background(), rec)
	return nil
}

// Flush implements egresslog.Sink. The batch processor exports on its own
// schedule; Flush does not wait for the pipeline.
func (s *LogSink) Flush() error { return nil }

// Stats report the records this sink did not deliver.
func (s *LogSink) Stats() Stats { return s.q.stats() }

// Close exports what is batched, waiting at most 5 s for the pipeline,
// and stops the exporter. A Log closes its sinks when it stops.
func (s *LogSink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.provider.Shutdown(ctx)
}
