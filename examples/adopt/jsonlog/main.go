// Command jsonlog uses egresslog alone: records written as JSON lines.
package main

import (
	"context"
	"os"
	"time"

	"github.com/agenthold/egress/egresslog"
)

func main() {
	l := &egresslog.Log{Sinks: []egresslog.Sink{egresslog.NewJSONSink(os.Stdout)}}
	t := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	l.Record(egresslog.Record{Time: t, Agent: "agent-1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true, Reason: "allowed by rule"})
	l.Shutdown(context.Background())
}
