//go:build linux

package main

import (
	"context"
	"encoding/hex"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/examples/lifecycle"
	"github.com/agenthold/egress/internal/otlptest"
	"github.com/agenthold/egress/policy/approval"
)

// TestOTLPConfig: egress.otlp sends the records, the spans of HTTP
// requests (in the agent's trace) and the counters, the gateway's own
// among them, to the collector it names, over the protocol it names.
func TestOTLPConfig(t *testing.T) {
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(protocol, func(t *testing.T) {
			rc := otlptest.New()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			endpoint := rc.ServeHTTPOn(t, ln)
			if protocol == "grpc" {
				ln.Close()
				ln, err = net.Listen("tcp", "127.0.0.1:0")
				require.NoError(t, err)
				endpoint = rc.ServeGRPCOn(t, ln)
			}
			cfg := defaultConfig()
			cfg.DataDir = t.TempDir()
			cfg.Egress.OTLP = OTLPConfig{Logs: true, Traces: true, Metrics: true, Protocol: protocol, Endpoint: endpoint,
				Headers: map[string]string{"x-api-key": "k1"}, Interval: 50 * time.Millisecond}
			require.NoError(t, cfg.validate())
			s := &server{cfg: cfg, log: slog.New(slog.DiscardHandler), elog: &egresslog.Log{}, servers: lifecycle.New(t.Context()),
				agents: newAgents(cfg.DataDir), approvals: &approval.Broker{}}
			require.NoError(t, s.addOTLPSinks(t.Context()))
			require.NoError(t, s.startOTLPMetrics(t.Context()))
			s.elog.Record(egresslog.Record{Agent: "alice", Kind: egresslog.KindHTTP, Host: "api.github.com", Port: 443, Method: "GET", Path: "/user",
				Status: 200, Allowed: true, Reason: "allowed by rule", Trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
			require.NoError(t, s.elog.Shutdown(t.Context()))
			require.Eventually(t, func() bool {
				rc.Mu.Lock()
				defer rc.Mu.Unlock()
				return rc.Metrics["agenthold.agents"] != nil && rc.Metrics["egress.records"] != nil
			}, 5*time.Second, 20*time.Millisecond, "the gateway's counters did not arrive")
			s.servers.Stop(context.Background())

			rc.Mu.Lock()
			defer rc.Mu.Unlock()
			require.Len(t, rc.Logs, 1)
			assert.Equal(t, "alice", otlptest.Attrs(rc.Logs[0].Attributes)["egress.agent"])
			require.Len(t, rc.Spans, 1)
			assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", hex.EncodeToString(rc.Spans[0].TraceId))
			assert.Contains(t, rc.Services, "agenthold")
			for _, h := range rc.Headers {
				assert.Equal(t, "k1", h["x-api-key"])
			}
		})
	}
}
