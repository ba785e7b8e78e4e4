//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// sandboxPTYs bounds the pseudo-terminals one sandbox may hold at once:
// enough for a shell, tmux and a few editors.
const sandboxPTYs = 64

// newPTSInstance makes a devpts instance of the sandbox's own, not yet
// mounted anywhere: stage 1 opens the session's terminal in it, stage 2
// mounts it on /dev/pts. The host's devpts holds the operator's logins and
// every other sandbox's sessions, all drawn from kernel.pty.max: a sandbox
// that opened the host's /dev/ptmx until it failed would leave no terminal
// to anyone. A private instance is bounded by its max, and the kernel
// keeps kernel.pty.reserve terminals for the host's own instance that no
// other can take.
func newPTSInstance() (*os.File, error) {
	fs, err := unix.Fsopen("devpts", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("a devpts of the sandbox's own (kernel 5.2 or later): %w", err)
	}
	defer unix.Close(fs)
	for _, o := range [][2]string{
		{"ptmxmode", "0666"}, // the agent's uid opens ptmx
		{"mode", "0600"},     // a terminal belongs to whoever opened it
		{"max", strconv.Itoa(sandboxPTYs)},
	} {
		if err := unix.FsconfigSetString(fs, o[0], o[1]); err != nil {
			return nil, fmt.Errorf("a devpts of the sandbox's own: %s=%s: %w", o[0], o[1], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("a devpts of the sandbox's own: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, fmt.Errorf("a devpts of the sandbox's own: %w", err)
	}
	return os.NewFile(uintptr(mnt), "devpts"), nil
}

// openPTY opens a new pseudo-terminal pair in the instance pts.
func openPTY(pts *os.File) (master, slave *os.File, err error) {
	m, err := unix.Openat(int(pts.Fd()), "ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	master = os.NewFile(uintptr(m), "ptmx")
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock the pseudo-terminal: %w", err)
	}
	s, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		master.Close()
		return nil, nil, fmt.Errorf("open the pseudo-terminal: %w", errno)
	}
	return master, os.NewFile(s, "pts"), nil
}

// mountPTS mounts the instance pts on /dev/pts and makes /dev/ptmx its
// ptmx, so that whatever the sandbox opens comes from it.
func mountPTS(pts *os.File) error {
	if err := unix.MoveMount(int(pts.Fd()), "", unix.AT_FDCWD, "/dev/pts", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount the sandbox's /dev/pts: %w", err)
	}
	ptmx, err := filepath.EvalSymlinks("/dev/ptmx")
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing opens it but /dev/pts/ptmx
	}
	if err != nil {
		return fmt.Errorf("/dev/ptmx: %w", err)
	}
	if ptmx == "/dev/pts/ptmx" {
		return nil
	}
	if err := unix.Mount("/dev/pts/ptmx", ptmx, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("make /dev/ptmx the sandbox's own: %w", err)
	}
	return nil
}
