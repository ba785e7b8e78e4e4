//go:build linux

package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLinkExists(t *testing.T) {
	assert.True(t, LinkExists("lo"), "every namespace has lo")
	assert.False(t, LinkExists("no-such-link0"))
	assert.False(t, LinkExists("a-name-longer-than-sixteen-bytes"), "a name no interface can have")
}

// TestDoGoesHome: after Do, no thread of the process is left in the
// namespace, the main thread included (whose namespace is the process's,
// as /proc shows it).
func TestDoGoesHome(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("needs root and iproute2: %v", err)
	}
	ns, err := AddOrAdopt(fmt.Sprintf("nsdo-%d", os.Getpid()))
	require.NoError(t, err)
	t.Cleanup(func() { ns.Delete() })
	inside, err := os.Stat(ns.Path())
	require.NoError(t, err)
	for range 50 { // some run on the main thread
		require.NoError(t, ns.Do(func() error { return nil }))
	}
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		st, err := os.Stat(filepath.Join("/proc/self/task", task.Name(), "ns", "net"))
		if err != nil {
			continue // ended meanwhile
		}
		assert.False(t, os.SameFile(st, inside), "thread %s is still in the namespace", task.Name())
	}
}
