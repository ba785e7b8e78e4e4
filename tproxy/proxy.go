package tproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/budget"
	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// NamesFunc returns the names an agent resolved to an address through the
// gateway's DNS (dnsfilter.Server.Names), for TCP that is neither TLS nor
// HTTP.
type NamesFunc func(agent string, addr netip.Addr) []string

// Interceptor takes over TLS connections for hosts it claims; mitm
// implements it. Intercept owns conn (whose reads replay the bytes the
// proxy already read) and returns when the connection is done, with why
// it failed as a whole, if it did (the client refused the certificate),
// for the connection's record. It judges each request by the agent's
// policy as current returns it then, and registers each it forwards with
// the policy.InFlight of ctx, so that Rejudge and Forget reach a request
// in flight (a WebSocket, a stream) as they reach a connection.
type Interceptor interface {
	Claims(agent, host string) bool
	Intercept(ctx context.Context, conn net.Conn, agent string, current policy.Current, host string, port uint16) error
}

// ErrServerClosed is returned by Serve and ServeExplicit after Shutdown or
// Close.
var ErrServerClosed = errors.New("tproxy: server closed")

// Defaults for a Proxy's zero fields.
const (
	DefaultDialTimeout      = 10 * time.Second
	DefaultHelloTimeout     = 10 * time.Second
	DefaultIdleTimeout      = 15 * time.Minute
	DefaultMaxHelloSize     = 32 << 10
	DefaultMaxConns         = 20000
	DefaultMaxConnsPerAgent = 2000
	// DefaultKernelPathAfter is the bytes a connection moves one way on
	// the user-space relay before the KernelPath takes it: most
	// connections (an API call, a page) are done before then, and moving
	// one costs more than relaying its few bytes.
	DefaultKernelPathAfter = 64 << 10
	// DefaultKernelPathPerAgent bounds an agent's connections on the
	// KernelPath at once: with fastpath's 4 MiB a direction may queue
	// there, one agent's connections hold at most 128 MiB of it, half of
	// what all may (fastpath.DefaultMaxQueuedTotal), and never crowd the
	// others off it.
	DefaultKernelPathPerAgent = 16
	// DefaultMaxExplicitConnsPerSource bounds connections to the explicit
	// proxy from one address: a client keeps a few, a NAT in front of
	// remote agents many.
	DefaultMaxExplicitConnsPerSource = 1024
)

// Proxy is the transparent proxy and the explicit proxy. The zero Proxy
// drops every connection (it knows no agent); set Agents to serve. Set the
// fields before serving; a Proxy is safe for concurrent use.
type Proxy struct {
	// Agents identifies the agent behind a connection's source address;
	// nil, or an unknown source, drops the connection.
	Agents policy.AgentFunc
	// Names returns what an agent resolved to an address; nil means no
	// names, so TCP that is neither TLS nor HTTP is judged by address only.
	Names NamesFunc
	// Guard checks every upstream address at dial time; nil means the
	// built-in classification.
	Guard *netguard.Guard
	// Resolver resolves names on the gateway; nil means net.DefaultResolver.
	Resolver netguard.Resolver
	// Identify, if set, names the agent behind each explicit-proxy request
	// (CONNECT or absolute-form) from its Credentials: its
	// Proxy-Authorization, its TLS client certificate, or its source
	// address. An error refuses the request with 407 and the error as the
	// reason; compare tokens in constant time. Nil means Agents, by source
	// address.
	Identify func(Credentials) (agent string, pol *policy.Policy, err error)
	// Approver, if set, is asked about the names a policy in ask mode
	// would refuse for want of an entry (TLS by its server name, a plain
	// HTTP request by its Host, a CONNECT by its target): the connection
	// or request is held until it answers.
	Approver policy.Approver
	// Interceptor, if set, takes over TLS to the hosts it claims. Its
	// context carries the proxy's Guard and Resolver (netguard.WithGuard,
	// WithResolver), which an interceptor without its own dials through.
	Interceptor Interceptor
	// KernelPath, if set, moves the bytes of passed-through connections
	// in the kernel once they are judged and dialled (see KernelPath for
	// which); nil keeps every connection on the user-space relay.
	KernelPath KernelPath
	// KernelPathAfter is how many bytes either direction of a connection
	// moves on the user-space relay before the connection is handed to
	// the KernelPath; zero means DefaultKernelPathAfter, a negative value
	// hands it over at once.
	KernelPathAfter int
	// KernelPathPerAgent bounds the connections of one agent the
	// KernelPath holds at once; past it, the agent's connections stay on
	// the user-space relay. Zero means DefaultKernelPathPerAgent.
	KernelPathPerAgent int
	// Log receives one record per connection and per HTTP request.
	Log *egresslog.Log
	// Logger receives operational messages; nil discards them.
	Logger *slog.Logger
	// OriginalDst reads a redirected connection's original destination
	// from the TCP connection beneath what the listener yielded; nil means
	// OriginalDst (SO_ORIGINAL_DST, Linux only).
	OriginalDst func(*net.TCPConn) (netip.AddrPort, error)

	// DialTimeout bounds an upstream dial; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// HelloTimeout bounds the wait for a client's first bytes, a whole
	// ClientHello, and an HTTP request head; zero means DefaultHelloTimeout.
	HelloTimeout time.Duration
	// IdleTimeout closes a connection on which no byte moved either way for
	// this long; zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHelloSize bounds the bytes read to find a whole ClientHello; zero
	// means DefaultMaxHelloSize.
	MaxHelloSize int
	// MaxConns and MaxConnsPerAgent bound open connections, and
	// explicit-proxy requests in progress, which count as connections;
	// beyond them new ones are refused and recorded, and open ones go on.
	// The last quarter of MaxConns is kept for agents that hold fewer than
	// a sixteenth of MaxConnsPerAgent (budget.Fair), so that ten agents
	// at their bound cannot refuse every other agent's connections (never
	// more than MaxConns less MaxConnsPerAgent is kept: a per-agent bound
	// at or above MaxConns keeps none, and one agent may hold them all).
	// Zero means DefaultMaxConns and DefaultMaxConnsPerAgent. An agent's
	// rate of new connections and its bytes per second each way are its
	// policy's quotas (policy.Quotas).
	MaxConns, MaxConnsPerAgent int
	// MaxExplicitConnsPerSource bounds the connections to the explicit
	// proxy one source address holds open, before or between requests;
	// zero means DefaultMaxExplicitConnsPerSource.
	MaxExplicitConnsPerSource int

	initOnce sync.Once
	// baseCtx is the parent of every session's context; a forced
	// shutdown cancels it, which ends intercepted connections too.
	baseCtx   context.Context
	cancelAll context.CancelFunc
	open      atomic.Int64
	perAgent  sync.Map     // agent -> *atomic.Int64
	connRates budget.Rates // new connections per second, per agent
	bytesUp   budget.Rates // bytes per second towards destinations, per agent
	bytesDown budget.Rates // and back
	relays    relaySet
	// Connections to the explicit proxy, per listener address (a
	// *budget.Counter of them per source), and which are counted where.
	explicitConns   sync.Map       // listener address (netip.AddrPort) -> *budget.Counter
	explicitCounted sync.Map       // net.Conn -> *budget.Counter
	kernelConns     budget.Counter // connections on the KernelPath, by agent
	unidentified    budget.Rates   // records of refused, unidentified requests, per source
	agentConns      sync.Map       // agent -> *connSet: its sessions' client connections

	httpOnce      sync.Once
	httpSrv       *http.Server // serves transparent HTTP handed over by sessions
	httpConns     *connQueue
	pools         httpfwd.Pools[*policy.Policy] // plain HTTP upstream, each agent's own
	poolsH2C      httpfwd.Pools[*policy.Policy] // and HTTP/2 with prior knowledge
	forward       *httputil.ReverseProxy
	explicitSrvs  []*http.Server
	sessionsWG    sync.WaitGroup
	mu            sync.Mutex
	listeners     map[net.Listener]struct{}
	pending       map[net.Conn]context.CancelFunc // explicit connections whose first request is being read, and how to end its context
	closed        bool
	closedCh      chan struct{}
	sweeperActive bool
}

func (p *Proxy) init() {
	p.initOnce.Do(func() {
		p.listeners = map[net.Listener]struct{}{}
		p.pending = map[net.Conn]context.CancelFunc{}
		p.closedCh = make(chan struct{})
		p.baseCtx, p.cancelAll = context.WithCancel(context.Background())
		p.relays.m = map[mover]struct{}{}
	})
}

func (p *Proxy) logger() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// kernelSlot takes one of agent's places on the KernelPath, if it has
// one left; release gives it back.
func (p *Proxy) kernelSlot(agent string) (release func(), ok bool) {
	if !p.kernelConns.Acquire(agent, orDefault(p.KernelPathPerAgent, DefaultKernelPathPerAgent), 0) {
		return nil, false
	}
	return func() { p.kernelConns.Release(agent) }, true
}

// kernelPathAfter is KernelPathAfter, its zero the default.
func (p *Proxy) kernelPathAfter() int {
	if p.KernelPathAfter == 0 {
		return DefaultKernelPathAfter
	}
	return p.KernelPathAfter
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

func (p *Proxy) record(r egresslog.Record) {
	if p.Log != nil {
		p.Log.Record(r)
	}
}

// acquire reserves a connection slot for agent, within its policy's rate
// of new connections, or reports why not.
func (p *Proxy) acquire(agent string, pol *policy.Policy) (release func(), reason string) {
	if q := pol.Quotas().ConnectionsPerSecond; !p.connRates.Take(agent, 1, q, 2*q, time.Now()) {
		return nil, policy.ReasonQuotaConnections
	}
	total, perAgent := orDefault(p.MaxConns, DefaultMaxConns), orDefault(p.MaxConnsPerAgent, DefaultMaxConnsPerAgent)
	taken := p.open.Add(1)
	if taken > int64(total) {
		p.open.Add(-1)
		return nil, ReasonTooManyConns
	}
	v, ok := p.perAgent.Load(agent)
	if !ok {
		v, _ = p.perAgent.LoadOrStore(agent, new(atomic.Int64))
	}
	n := v.(*atomic.Int64)
	held := n.Add(1)
	why := ""
	switch {
	case held > int64(perAgent):
		why = ReasonAgentTooManyConns
	case !budget.Fair(int(held-1), perAgent, int(taken-1), total):
		why = ReasonConnsKept
	}
	if why != "" {
		n.Add(-1)
		p.open.Add(-1)
		return nil, why
	}
	return func() { n.Add(-1); p.open.Add(-1) }, ""
}

// Listen opens a TCP listener for Serve or ServeExplicit. Accepted
// connections get no TCP keep-alive: the proxy's idle timeout bounds
// them, and it saves four system calls per connection.
func Listen(network, addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(context.Background(), network, addr)
	if err != nil {
		return nil, fmt.Errorf("tproxy: %w", err)
	}
	return ln, nil
}

// Serve accepts connections redirected by nftables on ln and proxies each
// by name, until Shutdown or Close; it then returns ErrServerClosed.
func (p *Proxy) Serve(ln net.Listener) error {
	p.init()
	if !p.track(ln) {
		ln.Close()
		return ErrServerClosed
	}
	defer p.untrack(ln)
	p.startSweeper()
	err := p.acceptEach(ln, func(c net.Conn) bool {
		if !p.beginSession() {
			reset(c)
			return false
		}
		go func() {
			defer p.sessionsWG.Done()
			p.serveTransparent(c)
		}()
		return true
	})
	if err != nil {
		return err
	}
	return ErrServerClosed
}

// acceptEach accepts connections from ln until it fails, and hands each
// to handle, which says whether to go on; it backs off on shortages that
// pass (temporaryAcceptError). It returns nil once the proxy is closed.
func (p *Proxy) acceptEach(ln net.Listener, handle func(net.Conn) bool) error {
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			if temporaryAcceptError(err) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				p.logger().Warn("accept failed; retrying", "listener", ln.Addr().String(), "err", err, "delay", delay)
				time.Sleep(delay) // back off on EMFILE and friends
				continue
			}
			return err
		}
		delay = 0
		if !handle(c) {
			return nil
		}
	}
}

// beginSession counts a session that Shutdown must wait for, unless the
// proxy is closed; the lock keeps every Add before Shutdown's Wait.
func (p *Proxy) beginSession() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.sessionsWG.Add(1)
	return true
}

func (p *Proxy) track(ln net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.listeners[ln] = struct{}{}
	return true
}

func (p *Proxy) untrack(ln net.Listener) {
	p.mu.Lock()
	delete(p.listeners, ln)
	p.mu.Unlock()
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Shutdown stops accepting, then waits for open connections to finish
// until ctx is done, when it closes them.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.init()
	p.mu.Lock()
	already := p.closed
	p.closed = true
	for ln := range p.listeners {
		ln.Close()
	}
	for c, cancel := range p.pending {
		cancel()  // an approval awaited, a dial
		c.Close() // a first request not yet read, or its CONNECT not yet answered
	}
	explicit := p.explicitSrvs
	p.mu.Unlock()
	if !already {
		close(p.closedCh)
	}
	// The explicit servers' plain requests in flight finish, as the
	// sessions do; their hijacked tunnels are sessions.
	var servers sync.WaitGroup
	for _, s := range explicit {
		servers.Go(func() { s.Shutdown(ctx) })
	}
	p.httpOnce.Do(p.startHTTP) // so that no handoff starts a server after this
	p.httpConns.close()
	go p.httpSrv.Shutdown(ctx)
	done := make(chan struct{})
	go func() { p.sessionsWG.Wait(); servers.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		p.relays.closeAll() // first, so that each says why it ended, rather than end by its context
		p.cancelAll()
		p.httpSrv.Close()
		for _, s := range explicit {
			s.Close()
		}
		<-done
		return ctx.Err()
	}
}

// Close stops accepting and closes every connection at once.
func (p *Proxy) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// temporaryAcceptError reports whether an accept error is a shortage that
// passes (out of file descriptors or memory, an aborted handshake), so that
// Serve backs off instead of stopping.
func temporaryAcceptError(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
