//go:build unix

package vault

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// ownProcessGroup starts cmd in a process group of its own, which its
// cancellation kills whole.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}

func inode(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Ino)
	}
	return 0
}

// trustedFile refuses a source file that another user could have put
// there or could read: the file (its links followed) and its directory
// must be owned by root or by the gateway's user, and writable by no one
// else, and the file readable by no one but them and root's group or the
// gateway's. A file in a directory an agent can write could be swapped
// for a link to the master key; a file others can read (a Kubernetes
// Secret's files are 0644 unless its defaultMode says otherwise) is read
// by a sandbox that sees the host's files, under any uid.
func trustedFile(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("source file: %w", unwrapPath(err))
	}
	fi, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("source file: %w", unwrapPath(err))
	}
	readable := fi.Mode().Perm()&0o004 != 0
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().Perm()&0o040 != 0 {
		readable = readable || (st.Gid != 0 && st.Gid != uint32(os.Getgid())) // a group a sandbox may be in
	}
	if readable {
		return fmt.Errorf("source file: %s is readable by others (mode %v): refused, a sandbox could read the value (make it 0600, or a Secret volume's defaultMode 0400)", real, fi.Mode().Perm())
	}
	for _, p := range []string{real, filepath.Dir(real)} {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("source file: %w", unwrapPath(err))
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		if uid := uint32(os.Getuid()); (st.Uid != 0 && st.Uid != uid) || fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("source file: %s is owned by uid %d or writable by others (mode %v): refused, another user could change the value", p, st.Uid, fi.Mode().Perm())
		}
	}
	return nil
}
