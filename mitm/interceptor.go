package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/budget"
	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/internal/httpmeter"
	"github.com/agenthold/egress/internal/redact"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// Injector fills an outgoing request with an agent's secrets and returns
// the names of those it used; vault.Vault implements it. An error means
// the request must not be sent.
type Injector interface {
	Inject(agent string, r *http.Request) ([]string, error)
}

// Hook may answer a request at the gateway instead of sending it on (a
// token refresh, for instance). It returns true when it has written the
// response.
type Hook func(w http.ResponseWriter, r *http.Request, agent string) bool

// Reasons recorded for intercepted requests.
const (
	ReasonHostMismatch  = "request host differs from the TLS server name: judged on its own"
	ReasonAnswered      = "answered at the gateway"
	ReasonInjectFailed  = "secret could not be injected"
	ReasonRedactFailed  = "the response could not be redacted"
	reasonUpstreamError = "upstream: "
)

// DefaultTimeout bounds, for an Interceptor whose Timeout is zero, the TLS
// handshake with the sandbox, each request head and each upstream dial.
const DefaultTimeout = 10 * time.Second

// Interceptor terminates the sandbox's TLS for the hosts it claims, with a
// leaf from Leaves, and forwards each request over TLS verified against
// the system roots (or RootCAs) to what the request's host resolves to on
// the gateway, injecting secrets on the way. It implements the
// tproxy.Interceptor interface. Set the fields before use.
type Interceptor struct {
	// Leaves mints the certificates presented to the sandbox. Required.
	Leaves *Leaves
	// Claim says which hosts to intercept for an agent: usually those an
	// injection rule names. Nil claims none.
	Claim func(agent, host string) bool
	// Injector fills requests; nil injects nothing.
	Injector Injector
	// Redactor redacts the responses of exchanges that could carry a
	// secret; nil means the Injector, if it is a Redactor too (vault is).
	Redactor Redactor
	// Hooks are asked, in order, to answer each request first: one
	// judged, registered with the policy.InFlight of its context (so that
	// a policy change or its agent's removal ends it, the hook's own
	// requests too, by the request's context), and counted in its record.
	Hooks []Hook
	// Guard checks upstream addresses at dial time; nil means the Guard
	// of Intercept's context (tproxy passes its own), else the built-in
	// classification.
	Guard *netguard.Guard
	// Resolver resolves upstream names on the gateway; nil means the
	// Resolver of Intercept's context (tproxy passes its own), else
	// net.DefaultResolver.
	Resolver netguard.Resolver
	// RootCAs verify upstream servers; nil means the system roots.
	RootCAs *x509.CertPool
	// Log receives one record per request.
	Log *egresslog.Log
	// Logger receives operational messages (a client that refused the
	// interception leaf); nil discards them.
	Logger *slog.Logger
	// Timeout bounds the TLS handshake with the sandbox, each request head,
	// and upstream dials; zero means DefaultTimeout.
	Timeout time.Duration

	// Bounds on what one agent may take (zero means the default): the
	// concurrent streams of one intercepted HTTP/2 connection, the
	// agent's upstream connections in all and to one host (pooled per
	// agent, so that no agent's load reaches another's pool), and the rate
	// at which its connections may make the CA mint leaves for new names.
	MaxStreams               int
	MaxUpstreamConnsPerAgent int
	MaxUpstreamConnsPerHost  int
	MintsPerSecond           float64
	// MaxRequestsPerAgent bounds an agent's intercepted requests in
	// progress, over all its connections and streams (a request waiting
	// for an upstream connection holds memory too).
	MaxRequestsPerAgent int
	// MaxUpstreamConns and MaxRequests bound the same for every agent
	// together (zero means the default). Past three quarters of either,
	// only agents that hold few take more (budget.Fair): agents each
	// within their own bounds cannot together take the gateway's last. A
	// per-agent bound at or above its gateway bound keeps nothing back:
	// one agent may then hold the gateway's whole.
	MaxUpstreamConns int
	MaxRequests      int

	initOnce   sync.Once
	transports *httpfwd.Transports           // for hooks (Client)
	pools      httpfwd.Pools[*policy.Policy] // each agent's own, for its policy
	upstream   budget.Counter                // upstream connections, per agent and in all
	mints      budget.Rates                  // leaves minted, per agent
	requests   budget.Counter                // requests in progress, per agent and in all
	proxy      *httputil.ReverseProxy
}

// Defaults for an Interceptor's zero bounds.
const (
	DefaultMaxStreams               = 32
	DefaultMaxUpstreamConnsPerAgent = 64
	DefaultMaxUpstreamConnsPerHost  = 8
	DefaultMintsPerSecond           = 5
	DefaultMaxRequestsPerAgent      = 512
	DefaultMaxUpstreamConns         = 4096
	DefaultMaxRequests              = 8192
)

// Reasons for a bound a request met: its agent's requests would open more
// upstream connections than its share, or it has more requests in
// progress than its share; or the gateway's, all agents' together, are at
// their bound or in the part of it kept for agents that hold few.
const (
	ReasonUpstreamConns        = "too many upstream connections for this agent"
	ReasonAgentRequests        = "too many requests in progress for this agent"
	ReasonGatewayUpstreamConns = "too many upstream connections at the gateway"
	ReasonGatewayRequests      = "too many requests in progress at the gateway"
)

// BoundReasons are the reasons of the bounds above, which whoever counts
// refusals per agent counts however many other reasons an agent provokes.
func BoundReasons() []string {
	return []string{ReasonUpstreamConns, ReasonAgentRequests, ReasonGatewayUpstreamConns, ReasonGatewayRequests}
}

// boundError is a bound an upstream dial met: the request is refused with
// its reason, as a denial rather than an upstream's failure.
type boundError string

func (e boundError) Error() string { return string(e) }

// newPool makes an agent's own pool of upstream connections (for
// httpfwd.Pools, which keeps one per agent and policy).
func (i *Interceptor) newPool(agent string) *httpfwd.Transports {
	perAgent := orDefault(i.MaxUpstreamConnsPerAgent, DefaultMaxUpstreamConnsPerAgent)
	total := orDefault(i.MaxUpstreamConns, DefaultMaxUpstreamConns)
	return httpfwd.NewTransports(httpfwd.Config{
		Guard: i.Guard, Resolver: i.Resolver, DialTimeout: i.timeout(), RootCAs: i.RootCAs, HTTP2: true, Check: policy.DialCheck,
		MaxIdleConnsPerHost: orDefault(i.MaxUpstreamConnsPerHost, DefaultMaxUpstreamConnsPerHost),
		MaxConnsPerHost:     orDefault(i.MaxUpstreamConnsPerHost, DefaultMaxUpstreamConnsPerHost),
		Admit: func() (func(), error) {
			why := i.upstream.Take(agent, perAgent, total).Reason(ReasonUpstreamConns, ReasonGatewayUpstreamConns)
			if why != "" {
				// Idle connections hold slots too, in this pool and in
				// those earlier policies retired: give theirs back first.
				// Another agent's idle ones are its own: a gateway at its
				// bound closes none of them for this one.
				i.pools.CloseIdle(agent)
				if why = i.upstream.Take(agent, perAgent, total).Reason(ReasonUpstreamConns, ReasonGatewayUpstreamConns); why != "" {
					return nil, boundError(why)
				}
			}
			return func() { i.upstream.Release(agent) }, nil
		},
	})
}

func orDefault[T int | float64](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Claims reports whether the interceptor takes TLS to host for agent.
func (i *Interceptor) Claims(agent, host string) bool {
	return i.Claim != nil && i.Claim(agent, host)
}

func (i *Interceptor) logger() *slog.Logger {
	if i.Logger != nil {
		return i.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (i *Interceptor) timeout() time.Duration {
	if i.Timeout > 0 {
		return i.Timeout
	}
	return DefaultTimeout
}

func (i *Interceptor) init() {
	i.initOnce.Do(func() {
		i.pools.New = i.newPool
		i.transports = httpfwd.NewTransports(httpfwd.Config{
			Guard: i.Guard, Resolver: i.Resolver, DialTimeout: i.timeout(), RootCAs: i.RootCAs, MaxIdleConnsPerHost: 64, HTTP2: true,
		})
		i.proxy = &httputil.ReverseProxy{
			Rewrite:   i.rewrite,
			Transport: roundTripper{i},
			// Zero: responses of unknown length and server-sent events are
			// flushed on every write (ReverseProxy knows them); others are
			// buffered, which saves a TLS record per response.
			FlushInterval:  0,
			ErrorLog:       log.New(io.Discard, "", 0),
			ErrorHandler:   i.upstreamError,
			ModifyResponse: i.modifyResponse,
		}
	})
}

// CloseIdleConnections drops the kept-alive upstream connections.
// Connections in use are not affected.
func (i *Interceptor) CloseIdleConnections() {
	if i.transports != nil {
		i.transports.CloseIdleConnections()
	}
	i.pools.CloseIdleConnections()
}

// Forget drops an agent's pool of upstream connections, closing those
// that are idle. Call it with tproxy's Forget when an agent is removed:
// that ends the agent's intercepted connections, and with them the
// requests still using its pool.
func (i *Interceptor) Forget(agent string) {
	i.pools.Forget(agent)
}

// connInfo is what Intercept knows of a connection, for each request.
type connInfo struct {
	agent   string
	current policy.Current // the agent's policy at each request
	host    string         // the name tproxy decided on (the TLS server name)
	port    uint16
}

type connInfoKey struct{}

// Intercept serves one sandbox connection whose ClientHello named host:
// it presents host's leaf, speaks HTTP/1.1 or HTTP/2 as ALPN settles, and
// returns when the connection is done: nil, or why the connection failed
// as a whole (the client refused the leaf). It owns conn. Each request is
// judged by the agent's policy as current returns it then.
func (i *Interceptor) Intercept(ctx context.Context, conn net.Conn, agent string, current policy.Current, host string, port uint16) error {
	i.init()
	if _, err := i.redactor(); err != nil {
		conn.Close()
		i.logger().Error("interception refused", "agent", agent, "host", host, "err", err)
		return err
	}
	tlsConn := tls.Server(&stalledWrites{Conn: conn}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return i.leafFor(agent, host) },
		NextProtos:     []string{"h2", "http/1.1"},
		MinVersion:     tls.VersionTLS12,
	})
	// The handshake first, so that a client that refuses the leaf (one
	// that does not trust the CA) is told apart from one that just left.
	hctx, cancel := context.WithTimeout(ctx, i.timeout())
	err := tlsConn.HandshakeContext(hctx)
	cancel()
	if err != nil {
		tlsConn.Close()
		err = fmt.Errorf("mitm: client TLS handshake for %s: %w", host, err)
		i.logger().Warn("intercepted connection failed its handshake; does the sandbox trust the CA?", "agent", agent, "host", host, "err", err)
		return err
	}
	info := &connInfo{agent: agent, current: current, host: host, port: port}
	ln := &oneConnListener{conn: tlsConn, closed: make(chan struct{})}
	var active activeRequests
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !active.start() {
				w.Header().Set("Connection", "close")
				http.Error(w, "egress: connection is closing", http.StatusServiceUnavailable)
				return
			}
			defer active.done()
			i.serveHTTP(w, r)
		}),
		ReadHeaderTimeout: i.timeout(),
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: orDefault(i.MaxStreams, DefaultMaxStreams)},
		ErrorLog:          log.New(io.Discard, "", 0),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connInfoKey{}, info)
		},
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				ln.Close() // Serve returns
			}
		},
	}
	// Served on this goroutine, which waits for the connection anyway:
	// one goroutine fewer per intercepted connection.
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	srv.Serve(ln)
	stop()
	active.closeAndWait()
	srv.Close()
	tlsConn.Close()
	return nil
}

// stalledWrites is an intercepted connection beneath its TLS: once a
// write to it has timed out (a request was ended while its client read
// nothing: httpfwd.Client), every later write times out at once, so that
// TLS's close_notify, which would wait 5 s on such a client, does not
// hold the request's end, and its record, that long.
type stalledWrites struct {
	net.Conn
	timedOut atomic.Bool
}

func (c *stalledWrites) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.timedOut.Store(true)
	}
	return n, err
}

func (c *stalledWrites) SetWriteDeadline(t time.Time) error {
	if c.timedOut.Load() {
		t = time.Now()
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *stalledWrites) SetDeadline(t time.Time) error {
	if err := c.Conn.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// leafFor is host's leaf, minted for this agent only within its rate:
// each new name costs the gateway a key and a signature.
func (i *Interceptor) leafFor(agent, host string) (*tls.Certificate, error) {
	if cert := i.Leaves.cached(host, time.Now()); cert != nil {
		return cert, nil
	}
	rate := orDefault(i.MintsPerSecond, DefaultMintsPerSecond)
	if !i.mints.Take(agent, 1, rate, 4*rate, time.Now()) {
		return nil, &policy.QuotaError{Reason: policy.ReasonQuotaMints}
	}
	return i.Leaves.getFor(agent, host)
}

// activeRequests counts a connection's requests in progress under the
// lock that closeAndWait takes, so that no request starts after the wait
// has begun (a WaitGroup's Add may not race its Wait).
type activeRequests struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n is zero
}

// start counts a request in, unless the connection is closing.
func (a *activeRequests) start() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.n++
	return true
}

func (a *activeRequests) done() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n--
	if a.closed && a.n == 0 {
		close(a.idle)
	}
}

// closeAndWait refuses new requests and waits for those in progress.
func (a *activeRequests) closeAndWait() {
	a.mu.Lock()
	a.closed = true
	a.idle = make(chan struct{})
	if a.n == 0 {
		close(a.idle)
	}
	idle := a.idle
	a.mu.Unlock()
	<-idle
}

// reqState is one request's bookkeeping, shared by the handler, the
// rewrite and the transport through the request's context.
type reqState struct {
	info        *connInfo
	pol         *policy.Policy // the agent's policy when the request came
	host        string         // the request's own host, judged on its own
	secrets     []string
	injectErr   error
	upstreamErr string
	bound       string    // the reason of a bound the upstream dial met
	refused     bool      // netguard refused the upstream address
	redact      *Replacer // nil: nothing to redact
	wsSub       *Replacer // a WebSocket's client messages' substitutions, or nil
	upgraded    *upgraded // the upstream's switched connection, once it switched
}

type reqStateKey struct{}

func stateOf(ctx context.Context) *reqState {
	s, _ := ctx.Value(reqStateKey{}).(*reqState)
	return s
}

// serveHTTP judges one request on its own host, lets the hooks answer it,
// or forwards it with secrets injected, and records it.
func (i *Interceptor) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	info, _ := r.Context().Value(connInfoKey{}).(*connInfo)
	host := httpfwd.HostOnly(r.Host)
	rec := egresslog.Record{Time: start, Agent: info.agent, Kind: egresslog.KindHTTP, Host: host, Port: info.port, Method: r.Method, Path: r.URL.EscapedPath(),
		Trace: r.Header.Get("Traceparent"), ConnID: egresslog.ConnIDFrom(r.Context())}
	client, w := httpfwd.NewClient(w, r)
	defer client.Finish()
	cw := &httpmeter.Writer{ResponseWriter: w}
	var upgradedDown int64 // what an upgrade's upstream sent, beneath cw
	defer func() {
		if cw.Status != 0 { // else an upgrade's, written beneath it
			rec.Status = cw.Status
		}
		rec.BytesDown, rec.Duration = cw.Bytes+upgradedDown, time.Since(start)
		if i.Log != nil {
			i.Log.Record(rec)
		}
	}()
	if why := i.requests.Take(info.agent, orDefault(i.MaxRequestsPerAgent, DefaultMaxRequestsPerAgent), orDefault(i.MaxRequests, DefaultMaxRequests)).Reason(ReasonAgentRequests, ReasonGatewayRequests); why != "" {
		rec.Reason = why
		http.Error(cw, "egress: "+why, http.StatusServiceUnavailable)
		return
	}
	defer i.requests.Release(info.agent)
	var pol *policy.Policy // nil, which denies, once the agent is gone
	if info.current != nil {
		pol = info.current()
	}
	// The request by its host, method and path (and an MCP endpoint's
	// messages): what its own Host names, under the request entries for it.
	d := pol.DecideHTTP(r, host, info.port)
	canon := d.Name
	if d.Addr.IsValid() {
		canon = d.Addr.String()
	}
	rec.Allowed, rec.Report, rec.Reason, rec.Rule, rec.Tool = d.Allowed, d.Report, d.Reason, d.Rule, d.Tool
	if !d.Allowed {
		details := d.Reason
		if d.Rule != "" {
			details += ": " + d.Rule
		}
		if d.JSONRPCReply != "" {
			httpfwd.RefuseJSONRPC(cw, details, d.JSONRPCReply)
			return
		}
		httpfwd.Refuse(cw, http.StatusForbidden, "http_request_denied", details, true)
		return
	}
	if httpfwd.IsDoH(r) {
		if doh := pol.DecideDoH(host, info.port); !doh.Allowed {
			rec.Allowed, rec.Report, rec.Reason, rec.Rule = false, false, doh.Reason, ""
			httpfwd.Refuse(cw, http.StatusForbidden, "http_request_denied", doh.Reason, true)
			return
		}
	}
	if canon != info.host { // both canonical
		rec.Reason = ReasonHostMismatch
	}
	red, err := i.redactorFor(info.agent, canon)
	if err != nil {
		// Why is the operator's to read (a secret's source gone, a
		// token endpoint's error, which may name parts of a secret); the
		// sandbox is told only that.
		rec.Allowed, rec.Reason = false, ReasonRedactFailed+": "+err.Error()
		http.Error(cw, "egress: "+ReasonRedactFailed, http.StatusBadGateway)
		return
	}
	// Past this point everything the sandbox is sent, from a hook, the
	// upstream or an error page, goes through the one redacting writer.
	var out http.ResponseWriter = cw
	if red != nil {
		rw := newRedactingWriter(cw, red)
		defer rw.finish()
		out = rw
	}
	// From here on, whatever answers the request, a hook or the
	// forwarder, does so registered with the block that handed over its
	// connection, so that a policy change or its agent's removal ends it,
	// and counted.
	ctx, ended, done, stopped := inFlight(r, d, info, client)
	defer done()
	if stopped { // by a policy change, or the agent's removal, since it was judged
		client.Answering()
		why, _ := ended()
		rec.Allowed, rec.Report, rec.Reason, rec.Rule = false, false, why, ""
		httpfwd.Refuse(out, http.StatusForbidden, "http_request_denied", why, true)
		return
	}
	r = r.WithContext(ctx)
	body := httpmeter.CountRequest(r)
	defer func() { rec.BytesUp += body.Bytes() }()
	for _, h := range i.Hooks {
		if h(out, r, info.agent) {
			rec.Reason = ReasonAnswered
			if why, ok := ended(); ok {
				rec.Reason = why
			}
			return
		}
	}
	st := &reqState{info: info, pol: pol, host: canon, redact: red}
	if ws, ok := i.Injector.(WebSocketSubstituter); ok && red != nil && httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], "websocket") {
		if st.wsSub, err = ws.WebSocketSubstitution(info.agent, canon); err != nil || !red.CoversReplacements(st.wsSub) {
			// A value the redactor does not know (its source changed
			// since) would come back unredacted in an echoed frame.
			rec.Allowed, rec.Reason = false, ReasonInjectFailed
			http.Error(out, "egress: "+ReasonInjectFailed, http.StatusBadGateway)
			return
		}
	}
	notes := new(egresslog.Notes)
	// What the forwarding says of the request, however it ends: a
	// response cut short mid-stream ends it with a panic
	// (http.ErrAbortHandler), which the server recovers from.
	defer func() {
		if u := st.upgraded; u != nil {
			u.Close()
			rec.BytesUp += u.up.Load()
			upgradedDown = u.down.Load()
			rec.Status = http.StatusSwitchingProtocols
		}
		rec.Secret = strings.Join(st.secrets, ",")
		var refused interface{ Refused() bool }
		switch {
		case errors.As(st.injectErr, &refused) && refused.Refused():
			rec.Allowed, rec.Reason = false, st.injectErr.Error()
		case st.injectErr != nil:
			rec.Allowed, rec.Reason = false, ReasonInjectFailed
		case st.bound != "": // a bound the request met, not a failure
			rec.Allowed, rec.Reason = false, st.bound
		case st.upstreamErr != "":
			rec.Allowed = !st.refused
			rec.Reason = reasonUpstreamError + st.upstreamErr
		}
		if why, ok := ended(); ok {
			rec.Reason = why
		}
		rec.Reason = notes.Annotate(rec.Reason)
	}()
	i.proxy.ServeHTTP(out, r.WithContext(egresslog.WithNotes(context.WithValue(r.Context(), reqStateKey{}, st), notes)))
}

// rewrite points the request at the real host over TLS and injects the
// agent's secrets, after ReverseProxy has removed hop-by-hop headers and
// after every other change to the request.
func (i *Interceptor) rewrite(pr *httputil.ProxyRequest) {
	st := stateOf(pr.In.Context())
	pr.Out.URL.Scheme = "https"
	pr.Out.URL.Host = net.JoinHostPort(st.host, strconv.Itoa(int(st.info.port)))
	pr.Out.Host = pr.In.Host
	if st.redact != nil {
		// A whole body the gateway can read, and a WebSocket without
		// compression: what cannot be read cannot be redacted, and a
		// range of a redacted body would not line up with it.
		pr.Out.Header.Set("Accept-Encoding", "identity")
		pr.Out.Header.Del("Sec-WebSocket-Extensions")
		pr.Out.Header.Del("Range")
		pr.Out.Header.Del("If-Range")
	}
	// Last, for an injector that signs the request (AWS SigV4).
	if i.Injector != nil {
		// The answer's redactor goes with the request, so that a value
		// it would not redact (a secret's source changed since it was
		// made) is refused, not sent.
		if st.redact != nil {
			pr.Out = pr.Out.WithContext(redact.WithReplacer(pr.Out.Context(), st.redact))
		}
		st.secrets, st.injectErr = i.Injector.Inject(st.info.agent, pr.Out)
	}
}

// modifyResponse readies the response of an exchange that could carry a
// secret for the redacting writer.
func (i *Interceptor) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	if st.redact == nil {
		return nil
	}
	if err := prepareResponse(resp, st.redact, st.wsSub); err != nil {
		return fmt.Errorf("%w: %v", errRedactFailed, err)
	}
	return nil
}

// redactor is the Interceptor's Redactor: its own, else its Injector's;
// ErrNoRedactor when it has an Injector and neither, and nil when it
// injects nothing.
func (i *Interceptor) redactor() (Redactor, error) {
	if i.Redactor != nil {
		return i.Redactor, nil
	}
	if r, ok := i.Injector.(Redactor); ok {
		return r, nil
	}
	if i.Injector != nil {
		return nil, ErrNoRedactor
	}
	return nil, nil
}

// redactorFor is the replacer of an agent's exchange with host, or nil.
func (i *Interceptor) redactorFor(agent, host string) (*Replacer, error) {
	r, err := i.redactor()
	if r == nil {
		return nil, err
	}
	return r.Redactor(agent, host)
}

// roundTripper sends a request on the transport for its agent's private
// network permission, unless injection failed.
type roundTripper struct{ i *Interceptor }

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	st := stateOf(r.Context())
	if st.injectErr != nil {
		if r.Body != nil {
			r.Body.Close() // as a RoundTripper must, even when it sends nothing
		}
		return nil, errInjectFailed
	}
	r = r.WithContext(policy.WithPolicy(policy.WithAgent(r.Context(), st.info.agent), st.pol))
	res, err := rt.i.pools.RoundTrip(st.info.agent, st.pol, st.pol.AllowPrivateNetworks(), r)
	if err == nil {
		takeUpgrade(st, res)
	}
	return res, err
}

var (
	errInjectFailed = errors.New(ReasonInjectFailed)
	errRedactFailed = errors.New(ReasonRedactFailed)
)

// upstreamError answers 502 with a description of the failure that never
// includes the request URL (whose query may carry an injected secret).
func (i *Interceptor) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	var refused interface{ Refused() bool }
	var bound boundError
	switch {
	case errors.As(st.injectErr, &refused) && refused.Refused():
		http.Error(w, "egress: "+st.injectErr.Error(), http.StatusBadRequest)
		return
	case errors.Is(err, errInjectFailed):
		st.upstreamErr = ReasonInjectFailed
		http.Error(w, "egress: "+ReasonInjectFailed, http.StatusBadGateway)
		return
	case errors.As(err, &bound):
		st.bound = string(bound)
		http.Error(w, "egress: "+st.bound, http.StatusServiceUnavailable)
		return
	case errors.Is(err, errRedactFailed):
		st.upstreamErr = err.Error()
		http.Error(w, "egress: "+err.Error(), http.StatusBadGateway)
		return
	}
	// An error may quote what the upstream sent back, which may echo the
	// request: w redacts what the sandbox sees, and the record too.
	f := httpfwd.Describe(err)
	if st.redact != nil {
		f.Why = st.redact.String(f.Why)
	}
	st.upstreamErr, st.refused = f.Why, f.Refused
	http.Error(w, "egress: upstream "+st.host+": "+f.Why, http.StatusBadGateway)
}

// oneConnListener hands one connection to an http.Server.
type oneConnListener struct {
	mu     sync.Mutex
	conn   net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.conn
	l.conn = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{} }
