package otlp

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthold/egress/egresslog"
)

// TraceSink emits a span for every HTTP record: a request the gateway
// judged on its own, intercepted or plain. The span starts and ends when
// the request did, carries the record's attributes, and is the child of
// the span the agent's traceparent named (Record.Trace), or the root of a
// trace of its own.
//
// Every such request gets its span: the agent's sampled flag does not
// decide, so a traceparent cannot hide a request from the platform. A
// traceparent is the agent's word, though: it places the gateway's span
// in whatever trace it names, the agent's own or another's, and the span
// always says which agent it was (egress.agent).
type TraceSink struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	q        *queue
}

// NewTraces returns a sink that exports a span per HTTP record.
func NewTraces(ctx context.Context, s Settings) (*TraceSink, error) {
	exp, err := newTraceExporter(ctx, s)
	if err != nil {
		return nil, err
	}
	res, err := s.resource()
	if err != nil {
		return nil, err
	}
	q := &queue{limit: int64(s.queueSize())}
	provider := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(&countedSpans{SpanExporter: exp, q: q},
			sdktrace.WithMaxQueueSize(s.queueSize()), sdktrace.WithMaxExportBatchSize(min(512, s.queueSize())),
			sdktrace.WithExportTimeout(s.timeout()))))
	return &TraceSink{provider: provider, tracer: provider.Tracer("github.com/agenthold/egress/egresslog"), q: q}, nil
}

func newTraceExporter(ctx context.Context, s Settings) (sdktrace.SpanExporter, error) {
	protocol, endpoint, err := s.target("TRACES", "/v1/traces")
	if err != nil {
		return nil, err
	}
	if protocol == ProtocolGRPC {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(s.timeout())}
		if endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		}
		if s.Headers != nil {
			opts = append(opts, otlptracegrpc.WithHeaders(s.Headers))
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(s.timeout())}
	if endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	}
	if s.Headers != nil {
		opts = append(opts, otlptracehttp.WithHeaders(s.Headers))
	}
	return otlptracehttp.New(ctx, opts...)
}

// countedSpans releases the sink's queue as exports finish.
type countedSpans struct {
	sdktrace.SpanExporter
	q *queue
}

func (c *countedSpans) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	c.q.done(len(spans), err)
	return err
}

// WriteRecord implements egresslog.Sink.
func (s *TraceSink) WriteRecord(r *egresslog.Record) error {
	if r.Kind != egresslog.KindHTTP {
		return nil
	}
	if !s.q.take() {
		return ErrQueueFull
	}
	ctx := context.Background()
	if r.Trace != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": r.Trace})
	}
	_, span := s.tracer.Start(ctx, spanName(r), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(r.Time), trace.WithAttributes(attributes(r)...))
	switch {
	case !r.Allowed:
		span.SetStatus(codes.Error, r.Reason)
	case r.Status >= 500:
		span.SetStatus(codes.Error, "")
	}
	span.End(trace.WithTimestamp(r.Time.Add(r.Duration)))
	return nil
}

// spanName is a known method, or HTTP, and, for an allowed request, the
// policy entry that allowed it: names a backend indexes, which the agent
// cannot multiply (its hosts and methods are attributes).
func spanName(r *egresslog.Record) string {
	name := "HTTP"
	if m, known := httpMethod(r.Method); known {
		name = m
	}
	if r.Allowed && r.Rule != "" {
		name += " " + r.Rule
	}
	return name
}

// Flush implements egresslog.Sink. The batch processor exports on its own
// schedule; Flush does not wait for the pipeline.
func (s *TraceSink) Flush() error { return nil }

// Stats report the spans this sink did not deliver.
func (s *TraceSink) Stats() Stats { return s.q.stats() }

// Close exports what is batched, waiting at most 5 s for the pipeline,
// and stops the exporter. A Log closes its sinks when it stops.
func (s *TraceSink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.provider.Shutdown(ctx)
}
