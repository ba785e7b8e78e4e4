//go:build linux

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSandboxCannotMakeAUserNamespace: a sandbox's command cannot make a
// user namespace, in which it would hold every capability (and reach
// nf_tables, or mount filesystems); what it runs otherwise, threads and
// child processes included, runs as before.
func TestSandboxCannotMakeAUserNamespace(t *testing.T) {
	w := requireWorld(t)
	got, err := w.inSandbox("bob", `
unshare -Ur true 2>/dev/null && echo "unshare: made one" || echo "unshare: refused"
unshare -Urn sh -c 'nft add table inet probe' 2>/dev/null && echo "nftables reached" || echo "nftables refused"
python3 -c '
import os, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.fork()
if pid == 0: os._exit(0)
os.waitpid(pid, 0); print("threads and fork: fine")'`)
	require.NoError(t, err, got)
	assert.Contains(t, got, "unshare: refused")
	assert.NotContains(t, got, "made one")
	assert.Contains(t, got, "nftables refused")
	assert.NotContains(t, got, "nftables reached")
	assert.Contains(t, got, "threads and fork: fine")
}
