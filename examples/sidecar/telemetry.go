//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/egresslog/otlp"
	"github.com/agenthold/egress/examples/lifecycle"
)

// telemetry is what --otlp sends to an OpenTelemetry collector, and
// where.
type telemetry struct {
	logs, traces, metrics bool
	settings              otlp.Settings
}

// parseTelemetry reads --otlp's list of signals.
func parseTelemetry(signals string, settings otlp.Settings) (telemetry, error) {
	t := telemetry{settings: settings}
	if signals == "" {
		return t, nil
	}
	for _, s := range strings.Split(signals, ",") {
		switch strings.TrimSpace(s) {
		case "logs":
			t.logs = true
		case "traces":
			t.traces = true
		case "metrics":
			t.metrics = true
		default:
			return t, usageError{fmt.Sprintf("--otlp: %q is not logs, traces or metrics", s)}
		}
	}
	return t, nil
}

// start adds the sinks to l, before its first record, and exports its
// counters; the SDK's own errors go to the sidecar's log.
func (t telemetry) start(ctx context.Context, l *egresslog.Log, servers *lifecycle.Group, logger *slog.Logger) error {
	if !t.logs && !t.traces && !t.metrics {
		return nil
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("opentelemetry export", "err", err) }))
	if t.logs {
		sink, err := otlp.NewLogs(ctx, t.settings)
		if err != nil {
			return fmt.Errorf("--otlp logs: %w", err)
		}
		l.Sinks = append(l.Sinks, sink)
	}
	if t.traces {
		sink, err := otlp.NewTraces(ctx, t.settings)
		if err != nil {
			return fmt.Errorf("--otlp traces: %w", err)
		}
		l.Sinks = append(l.Sinks, sink)
	}
	if t.metrics {
		m, err := otlp.NewMetrics(ctx, t.settings, l)
		if err != nil {
			return fmt.Errorf("--otlp metrics: %w", err)
		}
		servers.OnStop("opentelemetry metrics", func(context.Context) error { return m.Close() })
	}
	return nil
}
