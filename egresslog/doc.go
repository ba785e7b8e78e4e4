// Package egresslog is the request log: one canonical [Record] per DNS
// query, connection and HTTP request that a sandbox makes, kept per agent
// and handed to sinks.
//
// A [Log] keeps the newest N records of each agent (default 5000) in a
// ring, lists and filters them, lets readers follow new ones, counts them
// for metrics, and writes them to any number of sinks (JSON lines, log/slog)
// from one background goroutine. Recording never waits: a follower that
// falls behind loses records and is told how many, and a slow or failing
// sink loses records and the Log counts them, so the proxy is never
// blocked by its log. Connections that are still open are listed as open
// ([Log.Begin]) and recorded with their byte counts when they close.
//
// Typical use (ExampleLog runs it):
//
//	sink, _ := egresslog.OpenJSONFile("/var/log/egress.jsonl")
//	l := &egresslog.Log{Keep: 5000, Sinks: []egresslog.Sink{sink}}
//	defer l.Shutdown(ctx)
//	l.Record(egresslog.Record{Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true, Reason: "allowed by rule"})
//	recent := l.List(egresslog.Filter{Agent: "a1", DeniedOnly: true}, 100)
//
// A record has no field that could carry a secret's value: Secret holds a
// secret's name, and Path never keeps the query string, where a credential
// placeholder may have been replaced. Strings are bounded (MaxHostLen and
// friends) and memory is bounded by Keep records for each of at most
// MaxAgents agents.
//
// egresslog imports only the standard library.
package egresslog
