package tproxy

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// server, watcher and connection must be gone after Close. It also lets
// the test binary serve as the helper processes of
// BenchmarkHoldConnections.
func TestMain(m *testing.M) {
	if role := os.Getenv("TPROXY_HOLD_ROLE"); role != "" {
		os.Exit(holdHelper(role))
	}
	goleak.VerifyTestMain(m)
}
