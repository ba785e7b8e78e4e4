//go:build linux

package main

import (
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSandboxCannotTakeTheHostsTerminals: the pseudo-terminals a sandbox
// opens come from an instance of its own, bounded, never from the host's
// devpts, whose every terminal (the operator's logins, other sandboxes'
// sessions) the kernel draws from one pool of kernel.pty.max.
func TestSandboxCannotTakeTheHostsTerminals(t *testing.T) {
	w := requireWorld(t)
	got, err := w.inSandbox("bob", `python3 -c '
import os, errno
held = []
try:
    while len(held) < 1000:
        held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    print("stopped:", errno.errorcode.get(e.errno, e.errno))
print("held:", len(held))
for fd in held: os.close(fd)
m, s = os.openpty()
print("again:", os.ttyname(s))
print("host ptys seen:", len([n for n in os.listdir("/dev/pts") if n.isdigit()]))'`)
	require.NoError(t, err, got)
	m := regexp.MustCompile(`held: (\d+)`).FindStringSubmatch(got)
	require.NotNil(t, m, got)
	held, _ := strconv.Atoi(m[1])
	assert.Equal(t, sandboxPTYs, held, "a sandbox's terminals are bounded: %s", got)
	assert.Contains(t, got, "stopped: ENOSPC")
	assert.Regexp(t, `again: /dev/pts/\d+`, got, "the sandbox still has terminals once it lets go of them")
	assert.Contains(t, got, "host ptys seen: 1\n", "the sandbox sees only its own terminal, not the host's")

	// The operator's terminal session gets its pty from the same instance.
	if _, err := exec.LookPath("script"); err != nil {
		return
	}
	inner := w.self + ` exec alice -- sh -c 'echo "inside: $(tty) $(ls /dev/pts | tr "\n" " ")"'`
	cmd := exec.Command("script", "-qec", inner, "/dev/null")
	cmd.Env = w.env()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `inside: /dev/pts/0 0 ptmx`, string(out), "the session's terminal is the sandbox's own")
}
