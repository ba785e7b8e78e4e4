//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
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
	for signal, on := range map[string]bool{"LOGS": t.logs, "TRACES": t.traces, "METRICS": t.metrics} {
		if on {
			if err := t.checkEndpoint(signal); err != nil {
				return err
			}
		}
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

// checkEndpoint refuses a collector on the Pod's loopback, the SDK's
// default among them: the sandbox shares that loopback, and could take
// the port first and receive the records and the exporter's headers.
func (t telemetry) checkEndpoint(signal string) error {
	endpoint := t.settings.Endpoint
	for _, v := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if endpoint == "" {
			endpoint = os.Getenv(v)
		}
	}
	if endpoint == "" {
		return usageError{"--otlp needs --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT): the default, localhost, is the Pod's loopback, which the sandbox shares"}
	}
	host := endpoint
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		host = u.Hostname()
	} else if h, _, err := net.SplitHostPort(endpoint); err == nil {
		host = h
	}
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return usageError{fmt.Sprintf("--otlp: %s is on the Pod's loopback, which the sandbox shares: name the collector's Service", endpoint)}
	}
	return nil
}
