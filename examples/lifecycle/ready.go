package lifecycle

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrNotReady reports that the output ended before the ready line came,
// usually because the child exited.
var ErrNotReady = errors.New("the output ended before the ready line")

// WaitReady reads r line by line until a line equals ready. After that it keeps
// draining r in the background, so the child never blocks on a full pipe.
// It fails with ErrNotReady when r ends first, and with a timeout error when
// timeout passes first.
func WaitReady(r io.Reader, ready string, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if sc.Text() == ready {
				done <- nil
				io.Copy(io.Discard, r)
				return
			}
		}
		done <- ErrNotReady
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("no %q line in %s", ready, timeout)
	}
}
