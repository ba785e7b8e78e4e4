package policyfile

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
)

// watchHarness starts a Watcher on a file in a fresh directory and lets a
// test wait for the policy it expects.
type watchHarness struct {
	t     *testing.T
	dir   string
	path  string
	w     *Watcher
	loads chan *policy.Policy
}

func newWatchHarness(t *testing.T) *watchHarness {
	h := &watchHarness{t: t, dir: t.TempDir(), loads: make(chan *policy.Policy, 64)}
	h.path = filepath.Join(h.dir, "policy.yaml")
	return h
}

func (h *watchHarness) start() {
	w, err := Watch(h.path, WatchConfig{
		Resync: time.Hour, // every change below must arrive through fsnotify
		OnLoad: func(p *policy.Policy, _ error) { h.loads <- p },
	})
	require.NoError(h.t, err)
	h.w = w
	h.t.Cleanup(func() { w.Close() })
}

func (h *watchHarness) write(content string) {
	h.t.Helper()
	require.NoError(h.t, os.WriteFile(h.path, []byte(content), 0o600))
}

// await waits until the current policy allows github.com:443 or not, and
// denies for the given reason when it denies.
func (h *watchHarness) await(step string, allowed bool, denyReason string) {
	h.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		p := h.w.Policy()
		if p.Decide("github.com", 443).Allowed == allowed && p.DenyReason() == denyReason {
			return
		}
		select {
		case <-h.loads:
		case <-deadline:
			require.Failf(h.t, "the policy did not reach the expected state in time",
				"%s: policy allows=%v deny reason %q; want allows=%v reason %q",
				step, p.Decide("github.com", 443).Allowed, p.DenyReason(), allowed, denyReason)
		}
	}
}

const (
	goodPolicy  = "enforce: true\nallowOut: [github.com]\n"
	otherPolicy = "enforce: true\nallowOut: [gitlab.com]\n"
)

func TestWatcherFailClosedSteps(t *testing.T) {
	h := newWatchHarness(t)
	h.start()
	h.await("absent at start", false, ReasonFileAbsent)

	h.write("")
	h.await("empty", false, ReasonFileEmpty)

	h.write("{{{ not yaml")
	h.await("garbage", false, ReasonFileInvalid)

	h.write("enforce: false\nallowOut: [github.com]\n")
	h.await("enforce false", false, policy.ReasonNotEnforced)

	h.write(goodPolicy)
	h.await("good", true, "")

	h.write("enforce: true\nallowOut: ['*.com']\n")
	h.await("bad edit after good", false, ReasonFileInvalid)

	h.write(goodPolicy)
	h.await("good again", true, "")

	h.write(otherPolicy)
	h.await("good edit that drops the host", false, "")

	h.write(goodPolicy)
	h.await("restored", true, "")

	require.NoError(t, os.Remove(h.path))
	h.await("deleted", false, ReasonFileAbsent)

	h.write(goodPolicy)
	h.await("recreated", true, "")
}

func TestWatcherStartsWithGoodFile(t *testing.T) {
	h := newWatchHarness(t)
	h.write(goodPolicy)
	h.start()
	// The first load happens before Watch returns.
	assert.True(t, h.w.Policy().Decide("github.com", 443).Allowed, "policy not loaded when Watch returned")
}

// TestWatcherRenameOver follows an atomic replace: write a temp file, then
// rename it over the policy.
func TestWatcherRenameOver(t *testing.T) {
	h := newWatchHarness(t)
	h.write(goodPolicy)
	h.start()
	tmp := filepath.Join(h.dir, ".policy.tmp")
	require.NoError(t, os.WriteFile(tmp, []byte(otherPolicy), 0o600))
	require.NoError(t, os.Rename(tmp, h.path))
	h.await("renamed over", false, "")
}

// TestWatcherKubernetesSwap follows the way the kubelet updates a
// ConfigMap or projected volume: the file is a symlink through "..data",
// which is itself a symlink swapped atomically to a new timestamped
// directory.
func TestWatcherKubernetesSwap(t *testing.T) {
	h := newWatchHarness(t)
	mkVersion := func(name, content string) {
		dir := filepath.Join(h.dir, name)
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(content), 0o600))
	}
	swapData := func(target string) {
		tmp := filepath.Join(h.dir, "..data_tmp")
		require.NoError(t, os.Symlink(target, tmp))
		require.NoError(t, os.Rename(tmp, filepath.Join(h.dir, "..data")))
	}
	mkVersion("..2026_01", goodPolicy)
	swapData("..2026_01")
	require.NoError(t, os.Symlink("..data/policy.yaml", h.path))
	h.start()
	h.await("initial", true, "")

	mkVersion("..2026_02", "enforce: true\nallowOut: [[\n")
	swapData("..2026_02")
	h.await("swapped to a bad version", false, ReasonFileInvalid)

	mkVersion("..2026_03", goodPolicy)
	swapData("..2026_03")
	h.await("swapped to a good version", true, "")
}

func TestWatchMissingDirectory(t *testing.T) {
	_, err := Watch(filepath.Join(t.TempDir(), "no", "such", "policy.yaml"), WatchConfig{})
	assert.Error(t, err, "Watch on a missing directory succeeded")
}
