package readyline

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaitFindsTheLineAndKeepsDraining(t *testing.T) {
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
	require.NoError(t, Wait(r, "ready", 5*time.Second))
	select {
	case <-written:
	case <-time.After(5 * time.Second):
		require.Fail(t, "the output was not drained after the ready line")
	}
}

func TestWaitFailsWhenTheOutputEnds(t *testing.T) {
	err := Wait(strings.NewReader("starting\nreadyish\n"), "ready", 5*time.Second)
	assert.ErrorIs(t, err, ErrEnded)
}

func TestWaitTimesOut(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	err := Wait(r, "ready", 50*time.Millisecond)
	assert.Error(t, err, "want a timeout")
	assert.NotErrorIs(t, err, ErrEnded, "want a timeout")
}
