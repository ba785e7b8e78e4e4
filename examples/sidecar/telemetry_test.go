//go:build linux

package main

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/egresslog/otlp"
)

// TestOTLPNeverOnThePodsLoopback: the sandbox shares the Pod's loopback,
// so a collector there (the SDK's default included) could be the
// sandbox's: --otlp refuses it.
func TestOTLPNeverOnThePodsLoopback(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "")
	for _, endpoint := range []string{"", "http://localhost:4318", "http://127.0.0.1:4317", "http://[::1]:4317", "http://collector.localhost:4318", "127.0.0.2:4317"} {
		tel, err := parseTelemetry("logs", otlp.Settings{Endpoint: endpoint})
		assert.NoError(t, err)
		assert.Error(t, tel.start(t.Context(), &egresslog.Log{}, nil, slog.New(slog.DiscardHandler)), "endpoint %q", endpoint)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://localhost:4318/v1/logs")
	tel, _ := parseTelemetry("logs", otlp.Settings{})
	assert.Error(t, tel.start(t.Context(), &egresslog.Log{}, nil, slog.New(slog.DiscardHandler)), "from the environment")
	t.Setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "")
	tel, _ = parseTelemetry("logs", otlp.Settings{Endpoint: "http://otel-collector.observability:4318"})
	l := &egresslog.Log{}
	assert.NoError(t, tel.start(t.Context(), l, nil, slog.New(slog.DiscardHandler)), "a collector's Service")
	assert.Len(t, l.Sinks, 1)
	l.Close()
}
