package lifecycle

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaitReadyFindsTheLineAndKeepsDraining(t *testing.T) {
	r, w := io.Pipe()
	written := make(chan struct{})
	go func() {
		defer close(written)
		io.WriteString(w, "starting\nready\n")
		// A pipe write blocks until it is read: without the drain the
		// writer would stall here.
		io.WriteString(w, strings.Repeat("log line\n", 1000))
		w.Close()
	}()
	require.NoError(t, WaitReady(r, "ready", 5*time.Second))
	select {
	case <-written:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the output was not drained after the ready line")
	}
}

func TestWaitReadyFailsWhenTheOutputEnds(t *testing.T) {
	err := WaitReady(strings.NewReader("starting\nreadyish\n"), "ready", 5*time.Second)
	assert.ErrorIs(t, err, ErrNotReady)
}

func TestWaitReadyTimesOut(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	err := WaitReady(r, "ready", 50*time.Millisecond)
	assert.Error(t, err, "want a timeout")
	assert.NotErrorIs(t, err, ErrNotReady, "want a timeout")
}
