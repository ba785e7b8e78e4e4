package testkit

import (
	"testing"

	"github.com/agenthold/egress/examples/netns"
)

// RequireNamespaces skips t unless this process can create network
// namespaces (root, with iproute2).
func RequireNamespaces(t testing.TB) {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skipf("requires root and iproute2 to create network namespaces: %v", err)
	}
}

// NewNS creates a network namespace with a unique name built on prefix,
// deleted when the test ends.
func NewNS(t testing.TB, prefix string) *netns.NS {
	t.Helper()
	n, err := netns.Add(netns.Unique(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Delete(); err != nil {
			t.Errorf("delete namespace %s: %v", n.Name, err)
		}
	})
	return n
}
