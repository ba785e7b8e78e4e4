// Package dnsfilter is the DNS server the sandboxes use. It answers by the
// policy of the agent behind each query's source address, refuses to be a
// channel out, and remembers which name each address came from.
//
// A name the agent's policy does not allow gets NXDOMAIN at once and is
// never forwarded, so long random labels and TXT queries for denied names
// carry nothing out; under a deny-all policy every lookup still gets its
// NXDOMAIN quickly instead of hanging. An allowed name is forwarded to the
// upstream resolvers (by default those of /etc/resolv.conf) over UDP,
// again over TCP when the answer is truncated, with a fresh ID, only the
// EDNS0 buffer size and DO bit of the client's options, and the answer's
// question checked. The answer is then filtered for the agent: every name
// in a CNAME chain must be allowed, address records (and SVCB/HTTPS
// address hints) that netguard would refuse for this agent are removed,
// and records outside the chain are dropped.
//
// Who may ask is decided at one door: every UDP query passes one read
// loop, which names the agent behind its source before anything else
// (TCP queries, the handler's first step). A query from a source no agent
// owns is dropped unanswered and counted ([Server.Counters]), never
// recorded, so that spoofed sources can neither fill the log nor aim
// answers anywhere. The loop bounds the queries each agent has in hand
// and never waits for room in the socket to answer: a reply it cannot
// send at once is dropped and counted. Names are put in canonical form
// (internal/hostname) as they come in, and recorded and remembered so.
//
// Every address the agent is given is remembered as address → name for
// the record's TTL, bounded below and above ([Server.Names]): tproxy judges
// TCP that is neither TLS nor HTTP by the name the agent resolved. Answers
// are cached by TTL, for 5 s at least, a TTL of 0 included, so that a
// zone's name server does not learn the order of an agent's lookups at
// its query rate (Server.CacheSize; each belongs to the agent whose
// query brought it, and a full cache makes room from the agent that holds
// the most, so that one agent's flood of names evicts its own answers, not
// its neighbours'), concurrent identical queries share one upstream
// exchange, and every query is recorded in egresslog.
//
// Only the query types applications ask are forwarded (A, AAAA, CNAME,
// HTTPS, SVCB, TXT, MX, SRV, NS, SOA, CAA, PTR, DS, DNSKEY, TLSA, NAPTR,
// SSHFP); any other gets NOTIMP, since each type is a new question about
// the same name, and its number a channel of its own.
//
// Where the policy allows a zone wholesale (Open mode, a wide wildcard),
// the lookups themselves could carry data out. The server counts, per
// agent and zone, the distinct names and labels looked up and the
// information they carry ([TunnelDetection]); beyond the bounds the
// lookups are recorded as "suspected DNS tunnelling", and refused if the
// operator asks. The gateway's own lookups for an agent count too.
//
// Typical use (ExampleServer_upstream runs it):
//
//	srv := &dnsfilter.Server{
//		Agents:    agents.Lookup, // a policy.AgentFunc: source address -> agent, policy
//		Upstreams: []string{"192.0.2.53:53"},
//		Guard:     guard,
//		Log:       log,
//	}
//	go srv.Serve(packetConn, listener)
//	defer srv.Shutdown(ctx)
//	names := srv.Names("agent-1", addr) // for tproxy
//
// dnsfilter does not redirect the sandbox's DNS to itself: tproxy's
// nftables rules do.
package dnsfilter
