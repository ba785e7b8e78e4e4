//go:build linux

package main

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/agenthold/egress/egresslog/otlp"
)

// otlpSettings are egress.otlp's, for egresslog/otlp.
func (s *server) otlpSettings() otlp.Settings {
	o := s.cfg.Egress.OTLP
	return otlp.Settings{Protocol: o.Protocol, Endpoint: o.Endpoint, Headers: o.Headers, Interval: o.Interval, ServiceName: "agenthold"}
}

// addOTLPSinks sends records as OTLP log records and HTTP requests as
// spans, as egress.otlp says: before the Log's first record. The SDK's
// own errors (a collector down) go to the server's log.
func (s *server) addOTLPSinks(ctx context.Context) error {
	o := s.cfg.Egress.OTLP
	if !o.Logs && !o.Traces && !o.Metrics {
		return nil
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { s.log.Warn("opentelemetry export", "err", err) }))
	if o.Logs {
		sink, err := otlp.NewLogs(ctx, s.otlpSettings())
		if err != nil {
			return fmt.Errorf("egress.otlp.logs: %w", err)
		}
		s.elog.Sinks = append(s.elog.Sinks, sink)
	}
	if o.Traces {
		sink, err := otlp.NewTraces(ctx, s.otlpSettings())
		if err != nil {
			return fmt.Errorf("egress.otlp.traces: %w", err)
		}
		s.elog.Sinks = append(s.elog.Sinks, sink)
	}
	return nil
}

// startOTLPMetrics exports the Log's counters, the agents and the
// approvals pending, as egress.otlp.metrics says: once agents and
// approvals exist.
func (s *server) startOTLPMetrics(ctx context.Context) error {
	if !s.cfg.Egress.OTLP.Metrics {
		return nil
	}
	m, err := otlp.NewMetrics(ctx, s.otlpSettings(), s.elog)
	if err != nil {
		return fmt.Errorf("egress.otlp.metrics: %w", err)
	}
	s.servers.OnStop("opentelemetry metrics", func(context.Context) error { return m.Close() })
	agents, err1 := m.Meter().Int64ObservableGauge("agenthold.agents", metric.WithUnit("{agent}"), metric.WithDescription("Agents with a network."))
	pending, err2 := m.Meter().Int64ObservableGauge("agenthold.approvals.pending", metric.WithUnit("{request}"), metric.WithDescription("Approval requests waiting for an answer, by agent."))
	if err1 != nil || err2 != nil {
		return fmt.Errorf("egress.otlp.metrics: %v %v", err1, err2)
	}
	_, err = m.Meter().RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(agents, int64(len(s.agents.list())))
		waiting := map[string]int64{}
		for _, req := range s.approvals.Pending() {
			waiting[req.Agent]++
		}
		for agent, n := range waiting {
			o.ObserveInt64(pending, n, metric.WithAttributes(attribute.String("egress.agent", agent)))
		}
		return nil
	}, agents, pending)
	return err
}
