package policyfile

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// server, watcher and connection must be gone after Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
