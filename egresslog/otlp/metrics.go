package otlp

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/agenthold/egress/egresslog"
)

// Metrics export a Log's counters as OTLP metrics, read from the Log at
// each export (nothing is counted twice, and the data path does nothing
// for them):
//
//	egress.records             records, by egress.agent
//	egress.denied              denials, by egress.agent and egress.reason
//	egress.injected            requests that carried a secret, by egress.agent
//	egress.bytes               bytes moved, by egress.agent and egress.direction (up, down)
//	egress.log.sink.failures   records a sink missed (queue full, write failed)
//
// A program adds its own instruments with Meter.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	meter    metric.Meter
}

// NewMetrics exports l's counters every Settings.Interval.
func NewMetrics(ctx context.Context, s Settings, l *egresslog.Log) (*Metrics, error) {
	exp, err := newMetricExporter(ctx, s)
	if err != nil {
		return nil, err
	}
	res, err := s.resource()
	if err != nil {
		return nil, err
	}
	var opts []sdkmetric.PeriodicReaderOption
	if s.Interval > 0 {
		opts = append(opts, sdkmetric.WithInterval(s.Interval))
	}
	opts = append(opts, sdkmetric.WithTimeout(s.timeout()))
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, opts...)))
	m := &Metrics{provider: provider, meter: provider.Meter("github.com/agenthold/egress/egresslog")}
	if err := m.observe(l); err != nil {
		provider.Shutdown(ctx)
		return nil, err
	}
	return m, nil
}

func newMetricExporter(ctx context.Context, s Settings) (sdkmetric.Exporter, error) {
	protocol, endpoint, err := s.target("METRICS", "/v1/metrics")
	if err != nil {
		return nil, err
	}
	if protocol == ProtocolGRPC {
		opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithTimeout(s.timeout())}
		if endpoint != "" {
			opts = append(opts, otlpmetricgrpc.WithEndpointURL(endpoint))
		}
		if s.Headers != nil {
			opts = append(opts, otlpmetricgrpc.WithHeaders(s.Headers))
		}
		return otlpmetricgrpc.New(ctx, opts...)
	}
	opts := []otlpmetrichttp.Option{otlpmetrichttp.WithTimeout(s.timeout())}
	if endpoint != "" {
		opts = append(opts, otlpmetrichttp.WithEndpointURL(endpoint))
	}
	if s.Headers != nil {
		opts = append(opts, otlpmetrichttp.WithHeaders(s.Headers))
	}
	return otlpmetrichttp.New(ctx, opts...)
}

// observe registers the Log's counters, read at each collection.
func (m *Metrics) observe(l *egresslog.Log) error {
	records, err1 := m.meter.Int64ObservableCounter("egress.records", metric.WithUnit("{record}"),
		metric.WithDescription("DNS queries, connections and HTTP requests recorded."))
	denied, err2 := m.meter.Int64ObservableCounter("egress.denied", metric.WithUnit("{record}"),
		metric.WithDescription("Denied DNS queries, connections and requests, by reason."))
	injected, err3 := m.meter.Int64ObservableCounter("egress.injected", metric.WithUnit("{request}"),
		metric.WithDescription("Requests that carried an injected secret."))
	bytes, err4 := m.meter.Int64ObservableCounter("egress.bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes moved for agents, by direction."))
	failures, err5 := m.meter.Int64ObservableCounter("egress.log.sink.failures", metric.WithUnit("{record}"),
		metric.WithDescription("Records the log's sinks missed: queue full or write failed."))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return err
	}
	_, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for agent, st := range l.Stats() {
			who := attribute.String("egress.agent", agent)
			o.ObserveInt64(records, int64(st.Records), metric.WithAttributes(who))
			o.ObserveInt64(injected, int64(st.Injected), metric.WithAttributes(who))
			o.ObserveInt64(bytes, int64(st.BytesUp), metric.WithAttributes(who, attribute.String("egress.direction", "up")))
			o.ObserveInt64(bytes, int64(st.BytesDown), metric.WithAttributes(who, attribute.String("egress.direction", "down")))
			for reason, n := range st.DeniedByReason {
				o.ObserveInt64(denied, int64(n), metric.WithAttributes(who, attribute.String("egress.reason", reason)))
			}
		}
		dropped, failed := l.SinkStats()
		o.ObserveInt64(failures, int64(dropped+failed))
		return nil
	}, records, denied, injected, bytes, failures)
	return err
}

// Meter is where a program adds instruments of its own, exported with
// the Log's.
func (m *Metrics) Meter() metric.Meter { return m.meter }

// Close exports the counters once more, waiting at most 5 s for the
// pipeline, and stops the exporter.
func (m *Metrics) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return m.provider.Shutdown(ctx)
}
