// Package egresslog is the request log: one canonical [Record] per DNS
// query, connection and HTTP request that a sandbox makes, kept per agent
// and handed to sinks.
//
// A [Log] keeps each agent's newest records in memory, lists and filters
// them, lets readers follow new ones, counts them for metrics, and writes
// them to any number of sinks (JSON lines, log/slog) from one background
// goroutine. Recording never waits: a follower that falls behind loses
// records and is told how many, and a slow or failing sink loses records
// and the Log counts them, so the proxy is never blocked by its log.
// Connections that are still open are listed as open ([Log.Begin]) and
// recorded with their byte counts when they close.
//
// # One bounded pipeline
//
// Every record passes through one place, Log.add (unexported), whether it
// comes from [Log.Record] or [Conn.End]; what leaves it is what the rings
// keep, the followers get and the sinks write, alike. A hostile agent
// cannot grow any of them without bound, nor push its own denials out of
// sight with allowed traffic:
//
//   - Rings. An agent's allowed records and its denied records (Allowed
//     false, or Report: what [Filter] DeniedOnly selects) are kept in two
//     rings: the newest Keep allowed and the newest KeepDenied denied
//     (each DefaultKeep, 5000, when zero). Allowed traffic never evicts a
//     denial. Rings grow as records arrive, so an idle agent costs little,
//     and at most MaxAgents agents (DefaultMaxAgents, 4096) are held.
//   - Summaries. At most DenialBurst refusals (Allowed false and not
//     Report; DefaultDenialBurst, 10) of one agent, kind and reason are
//     recorded one by one in a wall-clock second; the rest of that second
//     are folded into one summary record with their Count, emitted when
//     the second is over (by one timer per Log) or by Shutdown or Close.
//     [Log.Stats] still count every refusal. An agent's distinct reasons
//     in a second are bounded (32, then OtherReason per kind), so a
//     flood of refusals costs an agent's denied ring at most 41 keys ×
//     (DenialBurst + 1) records a second, not one per refusal. That is
//     still a bounded ring's limit: at the defaults, a flood of refusals
//     made to vary in reason moves the agent's older denials out of its
//     ring in about 11 s. The files and the other sinks keep them, and
//     Stats count them by reason.
//   - Files. A [JSONFile] is rotated by size: at most Keep rotated files
//     (DefaultKeepFiles, 3) of at most MaxBytes each (DefaultMaxFileBytes,
//     100 MiB) besides the current one, so disk use is bounded by
//     (Keep+1)×MaxBytes. [OpenJSONFile] uses these defaults.
//
// Typical use (ExampleLog runs it):
//
//	sink, _ := egresslog.JSONFile{Path: "/var/log/egress.jsonl", MaxBytes: 64 << 20}.Open()
//	l := &egresslog.Log{Keep: 5000, Sinks: []egresslog.Sink{sink}}
//	defer l.Shutdown(ctx)
//	l.Record(egresslog.Record{Agent: "a1", Kind: egresslog.KindTLS, Host: "api.github.com", Port: 443, Allowed: true, Reason: "allowed by rule"})
//	recent := l.List(egresslog.Filter{Agent: "a1", DeniedOnly: true}, 100)
//
// A record has no field that could carry a secret's value: Secret holds a
// secret's name, and Path never keeps the query string, where a credential
// placeholder may have been replaced. Strings are bounded (MaxHostLen and
// friends).
//
// A JSONFile with a Seal key is an audit trail: its lines are chained by
// SHA-256 and sealed with Ed25519 at the end of each file and about once a
// second as it is written, and Verify says where the files were changed,
// which lines were removed, reordered or added, and which last lines no
// seal covers yet (what a crash leaves, never counted as tampering).
//
// egresslog does not ship records anywhere but its sinks (egresslog/otlp
// has the OpenTelemetry ones); it imports only the standard library.
package egresslog
