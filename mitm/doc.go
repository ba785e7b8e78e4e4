// Package mitm intercepts TLS for the hosts that need a credential: it
// terminates the sandbox's TLS with a leaf certificate minted for the
// host by its own CA, reads each HTTP/1.1 or HTTP/2 request, judges it on
// its own host, fills in secrets through an Injector, and forwards it over
// TLS verified against the system roots. TLS to every other host passes
// through untouched (tproxy decides which is which, through the
// Interceptor's Claims).
//
// The CA is ECDSA P-256, created on first start and persisted, or made in
// memory per sandbox; leaves have fresh keys, are cached for 24 hours in a
// bounded LRU, and are minted once however many connections for a new
// host arrive together. Bundle and Env give a sandbox what it needs to
// trust the CA.
//
// Responses stream as they arrive (server-sent events, chunked bodies,
// large downloads in bounded memory); WebSocket upgrades pass through.
// Each request is judged by the policy as it is when the request comes;
// one being forwarded (a stream, a WebSocket) registers with the
// policy.InFlight of the context it was handed (tproxy gives one), which
// ends it when its agent is forgotten, or a policy change refuses it,
// judged again as it was judged, by its host, method, path, override
// methods and MCP messages, its body gone on (policy.DecideAgain;
// inFlight, inflight.go). Ending a request ends its handler's reads and
// writes on the sandbox's connection too, which its context does not (a
// client that reads nothing), and net/http is not left to wait, after
// the handler, for what it left unread of a body (httpfwd.Client, which
// tproxy's plain requests pass too). A request a Hook answers is
// registered, ended and counted the same way (TestHookedRequestEndsOnRejudge).
//
// What the sandbox may see of a secret is decided in one place: in an
// exchange that could carry one (its rule names the host), everything
// the sandbox is sent, by the upstream, a Hook or an error page, passes
// one redacting writer (redactingWriter, redact.go) with the Replacer the
// Redactor gives: 1xx and final headers, the body as it streams, HTTP/1.1
// and HTTP/2 trailers (announced or not, as gRPC's), with placeholders
// where they echo a value in every encoding a server would use (see
// SecretForms); fields that would reveal a length or digest
// (Content-Length, Content-Range, Digest...) are dropped, on HEAD too.
// An upgrade leaves HTTP: its response head is redacted before it is
// written and the server's WebSocket frames pass a frame redactor. Bytes
// are held back only while they could begin a value, so streams keep
// their pace. Such requests ask for the identity encoding and no range
// (gzip and deflate answers are decoded; any other encoding is refused)
// and offer no WebSocket compression. vault.Vault is a Redactor; an
// adopter's own Injector comes with a Redactor built with NewReplacer
// and SecretForms, or NoRedaction said on purpose: an Interceptor with
// an Injector and neither refuses every connection (ErrNoRedactor).
// Upstream connections are pooled. A request for another host than the
// TLS server name (HTTP/2 coalescing, a forged Host) is checked against
// the policy on its own, and the Injector fills it only by that host's
// rules. Hooks may answer chosen requests at the gateway; RefreshExchange
// answers OAuth refresh-token grants so that a rotating refresh token never
// leaves it: it asks for JSON itself, reads JSON and form-encoded answers,
// stores a rotated token before anything can fail, and refuses the
// token's placeholder in any other request to the endpoint.
//
// Typical use (ExampleInterceptor runs it, with vault, in front of a test
// server):
//
//	ca, err := mitm.LoadOrCreateCA(dataDir+"/egress/ca.crt", dataDir+"/egress/ca.key", "agenthold")
//	ic := &mitm.Interceptor{Leaves: &mitm.Leaves{CA: ca}, Claim: v.Covers, Injector: v, Log: log}
//	proxy := &tproxy.Proxy{Interceptor: ic, Guard: guard, Resolver: dns}
//
// mitm never sees a secret's value except inside the request the Injector
// fills, and never records it: records carry the secret's name, and error
// messages never carry a request URL.
package mitm
