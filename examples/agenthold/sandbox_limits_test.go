//go:build linux

package main

import (
	"bufio"
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSandboxIsTheOOMKillersFirstChoice: a sandbox's processes are what
// the kernel kills first when memory runs out. The kernel lets a process
// lower its score down to the floor last set by one holding
// CAP_SYS_RESOURCE: exec's root on a host sets it at 1000, so the sandbox
// cannot lower it at all; a root without that capability (in a container)
// leaves the floor where it was.
func TestSandboxIsTheOOMKillersFirstChoice(t *testing.T) {
	w := requireWorld(t)
	out, err := w.inSandbox("bob", `cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'
echo -1 > /proc/self/oom_score_adj 2>/dev/null && echo "below the floor" || echo "floor kept"
echo 0 > /proc/self/oom_score_adj 2>/dev/null && echo "lowered to 0" || echo "lowering refused"`)
	require.NoError(t, err, out)
	if holdsCapability(t, unix.CAP_SYS_RESOURCE) {
		assert.Equal(t, "1000\n1000\nfloor kept\nlowering refused\n", out)
	} else {
		assert.Equal(t, "1000\n1000\nfloor kept\nlowered to 0\n", out)
	}
}

// holdsCapability says whether this process has capability c in its
// effective set.
func holdsCapability(t *testing.T, c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	require.NoError(t, unix.Capget(&hdr, &data[0]))
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// TestSandboxForkBombStopsAtItsBound: an agent's processes stop at
// sandbox.max_processes (the demo's 256) across its sandboxes, while a
// neighbour's sandbox still starts; each process's descriptors are
// bounded too.
func TestSandboxForkBombStopsAtItsBound(t *testing.T) {
	w := requireWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Children that wait on a pipe until the parent is told to let go.
	bomb := exec.CommandContext(ctx, w.self, "exec", "bob", "--", "python3", "-c", `
import os, sys, errno
r, w = os.pipe()
children = 0
try:
    while children < 2000:
        if os.fork() == 0:
            os.close(w); os.read(r, 1); os._exit(0)
        children += 1
except OSError as e:
    print("stopped:", errno.errorcode.get(e.errno, e.errno))
print("children:", children, flush=True)
sys.stdin.read()
os.close(w)
for _ in range(children): os.wait()
print("done", flush=True)`)
	bomb.Env = w.env()
	stdin, err := bomb.StdinPipe()
	require.NoError(t, err)
	stdout, err := bomb.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, bomb.Start())
	t.Cleanup(func() { stdin.Close(); bomb.Wait() })
	lines := bufio.NewScanner(stdout)
	var report []string
	for lines.Scan() {
		report = append(report, lines.Text())
		if strings.HasPrefix(lines.Text(), "children:") {
			break
		}
	}
	got := strings.Join(report, "\n")
	m := regexp.MustCompile(`children: (\d+)`).FindStringSubmatch(got)
	require.NotNil(t, m, "the fork bomb's report: %s", got)
	children, _ := strconv.Atoi(m[1])
	assert.Contains(t, got, "stopped: EAGAIN", "the fork bomb ran out of its bound, not of its loop")
	assert.LessOrEqual(t, children, 256, "bob's processes are bounded")
	assert.Greater(t, children, 200, "bob may still run a build's worth")

	// While bob holds his bound, a second sandbox of his starts nothing
	// (its shell is the one process the kernel's check at setuid lets
	// past the bound), and alice's runs as ever.
	out, _ := w.inSandbox("bob", "/bin/true && echo forked")
	assert.NotContains(t, out, "forked", "bob's second sandbox ran past his bound (%s)", got)
	out, err = w.inSandbox("alice", "echo started; ulimit -n")
	require.NoError(t, err, out)
	assert.Equal(t, "started\n4096\n", out, "alice's sandbox starts, with its descriptors bounded")

	require.NoError(t, stdin.Close())
	for lines.Scan() {
		report = append(report, lines.Text())
	}
	assert.NoError(t, bomb.Wait())
	assert.Contains(t, strings.Join(report, "\n"), "done")
}
