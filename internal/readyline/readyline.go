// Package readyline waits for a child process to say on its standard output
// that it is ready: the handshake the example programs and the integration
// tests use to know a server's listeners are open before they send traffic.
package readyline

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrEnded reports that the output ended before the ready line came,
// usually because the child exited.
var ErrEnded = errors.New("the output ended before the ready line")

// Wait reads r line by line until a line equals ready. After that it keeps
// draining r in the background, so the child never blocks on a full pipe.
// It fails with ErrEnded when r ends first, and with a timeout error when
// timeout passes first.
func Wait(r io.Reader, ready string, timeout time.Duration) error {
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
		done <- ErrEnded
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("no %q line in %s", ready, timeout)
	}
}
