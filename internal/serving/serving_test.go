package serving

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

var errClosed = errors.New("closed")

func TestAFailingServerEndsTheGroup(t *testing.T) {
	g := New(context.Background())
	stop := make(chan struct{})
	g.Go("quiet", func() error { <-stop; return errClosed }, errClosed)
	g.Go("broken", func() error { return errors.New("accept: too many open files") })
	select {
	case <-g.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a failing server did not end the group's context")
	}
	close(stop)
	err := g.Wait()
	assert.EqualError(t, err, "broken: accept: too many open files")
}

func TestClosedServersEndQuietly(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	g := New(parent)
	g.Go("a", func() error { <-g.Context().Done(); return errClosed }, errClosed)
	g.Go("b", func() error { <-g.Context().Done(); return nil })
	cancel()
	assert.NoError(t, g.Wait())
}
