package mitm

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/egresslog/otlp"
)

// tracedTransport sends every request in one trace of the agent's, as an
// instrumented agent would.
type tracedTransport struct{ http.RoundTripper }

func (t tracedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	return t.RoundTripper.RoundTrip(r)
}

// BenchmarkTelemetryBlackHole sends b.N intercepted requests, one after
// another on a kept-alive connection, through a gateway whose records go
// to a JSON sink and to OTLP logs and spans at a collector that accepts
// connections and never answers, and through one whose records go to the
// JSON sink only, interleaved, and reports both rates and their ratio:
// what an exporter whose collector is down adds to the data path. (Any
// sink at all costs the Log's hand-off to its sink goroutine, in both.)
func BenchmarkTelemetryBlackHole(b *testing.B) {
	plain, exported := newRig(b), newRig(b)
	s := otlp.Settings{Endpoint: otlpBlackHole(b), Timeout: time.Second}
	logs, err := otlp.NewLogs(b.Context(), s)
	require.NoError(b, err)
	spans, err := otlp.NewTraces(b.Context(), s)
	require.NoError(b, err)
	plain.log.Sinks = []egresslog.Sink{egresslog.NewJSONSink(io.Discard)} // before their first record
	exported.log.Sinks = []egresslog.Sink{egresslog.NewJSONSink(io.Discard), logs, spans}
	b.Cleanup(func() { plain.log.Close() })
	b.Cleanup(func() { exported.log.Close() })
	without, with := plain.clientFor(plain.viaTProxy(b, true), true), exported.clientFor(exported.viaTProxy(b, true), true)
	for _, c := range []*http.Client{without, with} {
		c.Transport = tracedTransport{c.Transport}
		getRate(b, c, "https://api.test/", 10, 1) // open the connection
	}
	compare(b, "req/s", "without", "black-hole",
		func(n int) float64 { return getRate(b, without, "https://api.test/", n, 1) },
		func(n int) float64 { return getRate(b, with, "https://api.test/", n, 1) })
}

// otlpBlackHole accepts connections and never answers; it returns the
// URL.
func otlpBlackHole(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	conns := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			select {
			case conns <- c: // held open, never answered
			default:
				c.Close()
			}
		}
	}()
	b.Cleanup(func() {
		ln.Close()
		for c := range conns {
			c.Close()
		}
	})
	return "http://" + ln.Addr().String()
}
