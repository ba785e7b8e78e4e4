// Package serving runs a program's servers as one group: the first that
// stops with an unexpected error ends the group's context, so that the
// program stops as a whole instead of running on without it. The example
// programs use it for their DNS, proxy, admin and health servers.
package serving

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"
)

// Group is a set of running servers.
type Group struct {
	g   *errgroup.Group
	ctx context.Context
}

// New returns a group whose context ends with ctx, or when a server fails.
func New(ctx context.Context) *Group {
	g, gctx := errgroup.WithContext(ctx)
	return &Group{g: g, ctx: gctx}
}

// Context ends when the parent's does or a server has failed: the
// program's cue to stop.
func (g *Group) Context() context.Context { return g.ctx }

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

// Wait waits for every server to return and reports the first failure.
func (g *Group) Wait() error { return g.g.Wait() }
