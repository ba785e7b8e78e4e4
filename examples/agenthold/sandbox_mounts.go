//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// scratchDirs get an empty, private, writable tmpfs in every sandbox:
// nothing of the host's temporary files, shared memory, run-time state
// (daemons' sockets, lock files) or users' homes is seen or shared.
var scratchDirs = []struct{ dir, mode string }{
	{"/tmp", "1777"}, {"/var/tmp", "1777"}, {"/dev/shm", "1777"}, {"/run", "0755"}, {"/home", "0755"},
}

// confineMounts builds the sandbox's view of the filesystem in its own
// mount namespace: the host's tree read-only and without setuid, the
// scratch directories private, the gateway's state and the list of
// namespaces hidden, the CA files and the agent's home where the sandbox
// expects them, and its own pseudo-terminals (pts, from newPTSInstance).
func confineMounts(info ExecInfo, pts *os.File) error {
	// Nothing mounted here propagates back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// Read what the sandbox gets a copy of while it is still visible.
	trust := map[string][]byte{}
	for _, p := range info.TrustFiles {
		if !within(p, info.DataDir) {
			return fmt.Errorf("trust file %s is not under the data directory", p)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("trust file: %w", err)
		}
		trust[p] = b
	}
	home, err := unix.Open(info.Home, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the agent's home %s: %w", info.Home, err)
	}
	defer unix.Close(home)
	etcFiles := map[string]string{}
	for _, name := range []string{"resolv.conf", "hosts"} {
		target, err := filepath.EvalSymlinks("/etc/" + name)
		if err != nil {
			return fmt.Errorf("/etc/%s: %w", name, err)
		}
		etcFiles[name] = target
	}

	// The host's whole tree: read-only, no setuid. Writable places are
	// only those mounted below, private to this sandbox, so no two
	// sandboxes share a file, a lock or a unix socket.
	if err := unix.MountSetattr(-1, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID}); err != nil {
		return fmt.Errorf("make the host's tree read-only: %w", err)
	}
	var mine []string // the tmpfs mounts made here, in which missing dirs may be made
	for _, s := range scratchDirs {
		if _, err := os.Stat(s.dir); err != nil {
			continue // nothing of the host's there
		}
		if err := mountTmpfs(s.dir, s.mode, mine); err != nil {
			return err
		}
		mine = append(mine, s.dir)
	}
	// The gateway's state, and the names of every agent's namespace.
	if err := mountTmpfs(info.DataDir, "0755", mine); err != nil {
		return err
	}
	mine = append(mine, info.DataDir)
	for _, p := range append([]string{"/etc/netns"}, info.Hide...) {
		if err := hide(p, mine); err != nil {
			return err
		}
	}
	for p, b := range trust {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t" + info.Agent + "\n"
	for name, content := range map[string]string{"resolv.conf": info.ResolvConf, "hosts": hosts} {
		if err := placeFile(filepath.Join(info.DataDir, name), etcFiles[name], content, mine); err != nil {
			return fmt.Errorf("place /etc/%s: %w", name, err)
		}
	}
	inside := sandboxHome(info)
	if err := os.Mkdir(inside, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(home), inside, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount the agent's home: %w", err)
	}
	// A bind takes the flags of its source's mount (read-only now): set
	// the home's own.
	if err := unix.Mount("", inside, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount the agent's home writable: %w", err)
	}
	if err := mountPTS(pts); err != nil {
		return err
	}
	// /proc for this PID namespace, /sys for this network namespace.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	unix.Unmount("/sys", unix.MNT_DETACH) // absent or busy: mounted over below
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	return nil
}

// placeFile writes content to file (in the sandbox's own tmpfs) and binds
// it over target, the file /etc/NAME resolves to; a target in a tmpfs
// made here (/run/systemd/resolve/stub-resolv.conf, say) is made first.
func placeFile(file, target, content string, mine []string) error {
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		return err
	}
	if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) && withinAny(target, mine) {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, nil, 0o644); err != nil {
			return err
		}
	}
	return unix.Mount(file, target, "", unix.MS_BIND, "")
}

// mountTmpfs mounts an empty tmpfs at dir. A dir that is gone because it
// lay in a tmpfs made here (mine) is made again there; any other dir must
// exist, since nothing is ever created on the host.
func mountTmpfs(dir, mode string, mine []string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if !withinAny(dir, mine) {
			return fmt.Errorf("%s does not exist", dir)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+mode+",size=64m"); err != nil {
		return fmt.Errorf("hide %s: %w", dir, err)
	}
	return nil
}

// hide makes path unreachable: an empty tmpfs over a directory, /dev/null
// over anything else. A path that does not exist (or is already hidden)
// is left alone.
func hide(path string, mine []string) error {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hide %s: %w", path, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("hide %s: %w", path, err)
	}
	if st.IsDir() {
		return mountTmpfs(real, "0755", mine)
	}
	if err := unix.Mount("/dev/null", real, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("hide %s: %w", path, err)
	}
	return nil
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

func withinAny(path string, dirs []string) bool {
	for _, d := range dirs {
		if within(path, d) {
			return true
		}
	}
	return false
}
