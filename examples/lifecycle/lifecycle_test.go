package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errClosed = errors.New("closed")

func TestAFailingServerEndsTheGroup(t *testing.T) {
	g := New(t.Context())
	stop := make(chan struct{})
	g.Go("quiet", func() error { <-stop; return errClosed }, errClosed)
	g.Go("broken", func() error { return errors.New("accept: too many open files") })
	select {
	case <-g.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a failing server did not end the group's context")
	}
	close(stop)
	assert.EqualError(t, g.Wait(), "broken: accept: too many open files")
}

func TestClosedServersEndQuietly(t *testing.T) {
	parent, cancel := context.WithCancel(t.Context())
	g := New(parent)
	g.Go("a", func() error { <-g.Context().Done(); return errClosed }, errClosed)
	g.Go("b", func() error { <-g.Context().Done(); return nil })
	cancel()
	assert.NoError(t, g.Wait())
}

// TestStopRunsStepsLastFirst: the steps run in reverse order of
// registration, each once, all of them whatever one returns, and the
// errors come back named.
func TestStopRunsStepsLastFirst(t *testing.T) {
	g := New(t.Context())
	var order []string
	for _, name := range []string{"log", "dns", "proxy", "admin"} {
		g.OnStop(name, func(context.Context) error {
			order = append(order, name)
			if name == "dns" {
				return errors.New("queries still in flight")
			}
			return nil
		})
	}
	err := g.Stop(t.Context())
	assert.Equal(t, []string{"admin", "proxy", "dns", "log"}, order)
	assert.EqualError(t, err, "stop dns: queries still in flight")
	assert.NoError(t, g.Stop(t.Context()), "a second Stop does nothing")
	assert.Len(t, order, 4, "a step ran twice")
	select {
	case <-g.Stopping():
	default:
		t.Fatal("Stopping is not closed after Stop")
	}
}

// TestAStepWithItsOwnTime: a step that drains until Stop's deadline
// leaves a step WithOwnTime its own time to write out in.
func TestAStepWithItsOwnTime(t *testing.T) {
	g := New(t.Context())
	var logErr error
	g.OnStop("egress log", WithOwnTime(time.Second, func(ctx context.Context) error {
		logErr = ctx.Err()
		_, bounded := ctx.Deadline()
		assert.True(t, bounded, "the step's own time has no end")
		return nil
	}))
	g.OnStop("proxy", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, g.Stop(ctx), context.DeadlineExceeded, "the proxy's drain")
	assert.NoError(t, logErr, "the log had no time left to write out in")
}

// TestLateStepRunsAtOnce: a part registered after Stop began is closed
// at once rather than left running.
func TestLateStepRunsAtOnce(t *testing.T) {
	g := New(t.Context())
	require.NoError(t, g.Stop(t.Context()))
	var ran, drained bool
	g.OnStop("late", func(ctx context.Context) error {
		ran, drained = true, ctx.Err() == nil
		return nil
	})
	assert.True(t, ran, "a late step was left running")
	assert.False(t, drained, "a late step was given time to drain")
}

// TestStopAndWaitBoundsTheDrain: a step that drains until its context
// ends is cut at the drain time, and the failure that ended the group is
// reported with the stop's errors.
func TestStopAndWaitBoundsTheDrain(t *testing.T) {
	g := New(t.Context())
	g.Go("proxy", func() error { return errors.New("listener gone") })
	g.OnStop("proxy", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	<-g.Context().Done()
	err := g.StopAndWait(50 * time.Millisecond)
	assert.ErrorContains(t, err, "proxy: listener gone")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}
