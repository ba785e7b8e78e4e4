// Package lifecycle runs the servers of a program composed of the blocks
// and stops it in one order. Both example programs use it; a program of
// your own may import it or copy it (it needs only errgroup).
//
// The order is the one defer gives: what started last stops first. A
// program starts the log before the servers that write to it, the DNS
// server before the proxy that reads its answers, and the proxy before
// the admin API that changes it; stopping in reverse drains each part
// while everything it uses still works, then closes it. A part that did
// not start registered nothing, so a program that fails half-way up
// stops exactly what it started.
//
// The blocks stop the same way: Shutdown(ctx) drains until ctx is done
// and then closes what is left, so a step is usually a method value
// (proxy.Shutdown, log.Shutdown, httpServer.Shutdown).
//
// A program says it is ready by printing one line on its standard output
// once its listeners are open ("agenthold: ready", "sidecar: ready");
// whoever started it (a script, a test, the agenthold demo) waits for that
// line with WaitReady before sending traffic.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// Group is a program's running servers and the steps that stop it.
type Group struct {
	g   *errgroup.Group
	ctx context.Context

	mu       sync.Mutex
	steps    []step
	stopping chan struct{}
	stopped  bool
}

type step struct {
	name string
	stop func(context.Context) error
}

// New returns a group whose context ends with ctx, or when a server
// fails.
func New(ctx context.Context) *Group {
	g, gctx := errgroup.WithContext(ctx)
	return &Group{g: g, ctx: gctx, stopping: make(chan struct{})}
}

// Context ends when the parent's does or a server has failed: the
// program's cue to stop.
func (g *Group) Context() context.Context { return g.ctx }

// Stopping is closed when Stop begins, for work that must not hold up a
// stop (a client following a log, say).
func (g *Group) Stopping() <-chan struct{} { return g.stopping }

// Go runs serve. Its return is expected when it is nil or one of closed
// (the sentinel a server returns after Shutdown); anything else fails the
// group, named.
func (g *Group) Go(name string, serve func() error, closed ...error) {
	g.g.Go(func() error {
		err := serve()
		if err == nil {
			return nil
		}
		for _, c := range closed {
			if errors.Is(err, c) {
				return nil
			}
		}
		return fmt.Errorf("%s: %w", name, err)
	})
}

// OnStop registers a step of Stop. Register it once the part it stops
// has started. After Stop has begun, the step runs at once (with a
// context already done, so it closes rather than drains): a part that
// starts late still stops.
func (g *Group) OnStop(name string, stop func(ctx context.Context) error) {
	g.mu.Lock()
	if !g.stopped {
		g.steps = append(g.steps, step{name, stop})
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stop(ctx)
}

// Closing is a step that closes c: for what has nothing to drain.
func Closing(c io.Closer) func(context.Context) error {
	return func(context.Context) error { return c.Close() }
}

// WithOwnTime is a step that has d of its own to finish, however much of
// Stop's deadline the steps before it took: for what writes out what
// they left behind (the egress log, whose last records are those of the
// connections the proxy's drain ended).
func WithOwnTime(d time.Duration, stop func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
		defer cancel()
		return stop(ctx)
	}
}

// Stop runs the registered steps once each, last registered first, each
// with ctx (a step drains until ctx is done, then closes). Every step
// runs whatever the others return; the errors come back joined, each
// named by its step. Calls after the first do nothing.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return nil
	}
	g.stopped = true
	steps := g.steps
	g.steps = nil
	close(g.stopping)
	g.mu.Unlock()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i].stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", steps[i].name, err))
		}
	}
	return errors.Join(errs...)
}

// Wait waits for every server to return and reports the first failure.
func (g *Group) Wait() error { return g.g.Wait() }

// StopAndWait stops the group, giving its steps drain to drain, and
// waits for the servers: what a program does once Context has ended. It
// returns the failure that ended the group, if one did, and the stop's
// errors.
func (g *Group) StopAndWait(drain time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	stopErr := g.Stop(ctx)
	return errors.Join(g.Wait(), stopErr)
}
