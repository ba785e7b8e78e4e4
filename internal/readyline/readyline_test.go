package readyline

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
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
	if err := Wait(r, "ready", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-written:
	case <-time.After(5 * time.Second):
		t.Fatal("the output was not drained after the ready line")
	}
}

func TestWaitFailsWhenTheOutputEnds(t *testing.T) {
	err := Wait(strings.NewReader("starting\nreadyish\n"), "ready", 5*time.Second)
	if !errors.Is(err, ErrEnded) {
		t.Fatalf("got %v, want ErrEnded", err)
	}
}

func TestWaitTimesOut(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	err := Wait(r, "ready", 50*time.Millisecond)
	if err == nil || errors.Is(err, ErrEnded) {
		t.Fatalf("got %v, want a timeout", err)
	}
}
