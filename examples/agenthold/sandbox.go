//go:build linux

package main

// `agenthold exec` confines a command to an agent's sandbox in two
// stages, both this binary:
//
//  1. The command line (root) asks the server for the agent's ExecInfo,
//     enters the agent's network namespace on a locked thread, and starts
//     stage 2 from that thread in new mount, PID, UTS and IPC namespaces.
//  2. Stage 2 is PID 1 of the new PID namespace and still root. It hides
//     the gateway's files behind empty tmpfs mounts, gives the sandbox a
//     private /tmp, /var/tmp, /dev/shm and /home with only the agent's own
//     home in it, copies the CA files the environment names to where the
//     sandbox can read them, mounts /proc and /sys for its namespaces and
//     a bounded devpts of its own (stage 1 made it, and opened the
//     session's terminal in it), and drops every privilege on its thread:
//     no capability in any set, an empty bounding set, no_new_privs, and a
//     seccomp filter that makes no user namespace (in which it would hold
//     every capability again: noUserNamespaces). The command starts from
//     that thread as the agent's uid and gid with no supplementary group,
//     in a session of its own (no controlling terminal, so TIOCSTI cannot
//     type into the operator's shell). Stage 2 reaps orphans and exits
//     with the command's status; the kernel then kills whatever is left in
//     the PID namespace.
//
// What it does not do: it is not a container runtime. The host's root
// filesystem stays visible read-only as far as ordinary file permissions
// go (the agent's uid reads what "others" may read); the seccomp filter
// refuses user namespaces and nothing else, and beyond the agent's count
// of processes and each one's descriptors (limitResources) there is no
// cgroup limit.
// A production sandbox is a container (runc, gVisor) that joins the
// agent's network namespace: see `agent create --netns`.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExecInfo is what `agenthold exec` needs to confine a command to an
// agent's sandbox.
type ExecInfo struct {
	Agent string `json:"agent"`
	// NetNSPath is the agent's network namespace as the server sees it;
	// ServerPID lets the command line reach it through /proc/PID/root
	// when the server runs in a mount namespace of its own.
	NetNSPath string `json:"netns_path"`
	ServerPID int    `json:"server_pid"`
	UID       uint32 `json:"uid"`
	GID       uint32 `json:"gid"`
	// Home is the agent's home directory on the host; the sandbox sees it
	// as /home/AGENT.
	Home string   `json:"home"`
	Env  []string `json:"env"`
	// DataDir is hidden behind an empty tmpfs, in which the TrustFiles
	// (CA certificate and bundle, which must lie under it) are placed
	// again, readable by all.
	DataDir    string   `json:"data_dir"`
	TrustFiles []string `json:"trust_files"`
	// Hide lists other paths the sandbox must not reach (the admin
	// socket, the master key file).
	Hide []string `json:"hide"`
	// ResolvConf is the sandbox's /etc/resolv.conf.
	ResolvConf string `json:"resolv_conf"`
	// MaxProcesses and MaxOpenFiles are the command's RLIMIT_NPROC (its
	// uid's processes and threads) and RLIMIT_NOFILE.
	MaxProcesses int `json:"max_processes"`
	MaxOpenFiles int `json:"max_open_files"`
}

// sandboxInitCommand is the hidden command line of stage 2.
const sandboxInitCommand = "__sandbox-init"

// Stage 1 hands stage 2 its spec on file descriptor 3 and the sandbox's
// devpts instance (newPTSInstance) on 4.
const (
	specFd = 3
	ptsFd  = 4
)

// stage2Spec is what stage 1 hands stage 2 on specFd.
type stage2Spec struct {
	Info ExecInfo `json:"info"`
	Argv []string `json:"argv"`
	// TTYFd is the stdio descriptor that is the sandbox's pseudo-terminal,
	// to be the command's controlling terminal; -1 for none.
	TTYFd int    `json:"tty_fd"`
	Term  string `json:"term"`
}

// exitCode carries a command's exit status out of run.
type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// runSandboxed is stage 1: it enters the agent's network namespace and
// runs stage 2 there, forwarding signals, and returns the command's exit
// status as an exitCode.
func runSandboxed(info ExecInfo, argv []string) error {
	if os.Geteuid() != 0 {
		return errors.New("exec enters the sandbox's namespaces: run it as root")
	}
	ns, err := openNetNS(info)
	if err != nil {
		return err
	}
	defer ns.Close()
	pts, err := newPTSInstance()
	if err != nil {
		return err
	}
	defer pts.Close()
	stdio, err := newSandboxStdio(pts)
	if err != nil {
		return err
	}
	defer stdio.close()
	spec, err := json.Marshal(stage2Spec{Info: info, Argv: argv, TTYFd: stdio.ttyFd, Term: os.Getenv("TERM")})
	if err != nil {
		return err
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer specR.Close()

	// The thread enters the sandbox's network namespace and never leaves
	// it: it stays locked until the process exits, and the Go runtime
	// starts no thread from a locked one.
	runtime.LockOSThread()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		specW.Close()
		return fmt.Errorf("enter the sandbox's network namespace: %w", err)
	}
	if err := enterServerMounts(info); err != nil {
		specW.Close()
		return err
	}
	self, err := os.Executable()
	if err != nil {
		specW.Close()
		return err
	}
	cmd := exec.Command(self, sandboxInitCommand)
	cmd.Env = childEnv()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.files[0], stdio.files[1], stdio.files[2]
	cmd.ExtraFiles = []*os.File{specR, pts}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		specW.Close()
		return fmt.Errorf("start the sandbox: %w", err)
	}
	specR.Close()
	pts.Close()
	stdio.started()
	_, werr := specW.Write(spec)
	specW.Close()
	if werr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("start the sandbox: %w", werr)
	}
	stop := forwardSignals(cmd.Process.Pid)
	defer stop()
	err = cmd.Wait()
	stdio.finish()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return exitCode(statusCode(ee.Sys().(syscall.WaitStatus)))
	}
	return err
}

// openNetNS opens the agent's network namespace: at its path, or, when
// the server runs in a private mount namespace (started under `ip netns
// exec`, say) where the namespace's bind mount lives, through the
// server's /proc/PID/root.
func openNetNS(info ExecInfo) (*os.File, error) {
	paths := []string{info.NetNSPath}
	if info.ServerPID > 0 {
		paths = append(paths, filepath.Join("/proc", strconv.Itoa(info.ServerPID), "root", info.NetNSPath))
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var st unix.Statfs_t
		if unix.Fstatfs(int(f.Fd()), &st) == nil && st.Type == unix.NSFS_MAGIC {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("the network namespace %s of agent %s is not reachable from here: the server mounted it in a mount namespace this command cannot see; run exec in the server's mount namespace, or start the server with `nsenter --net=...` rather than `ip netns exec`", info.NetNSPath, info.Agent)
}

// enterServerMounts moves the calling (locked) thread into the server's
// mount namespace when the server has one of its own (started under `ip
// netns exec`, say): the sandbox is built from the server's view of the
// files, where the agent's home, a tmpfs the server mounted, is.
func enterServerMounts(info ExecInfo) error {
	if info.ServerPID <= 0 {
		return nil
	}
	theirs := fmt.Sprintf("/proc/%d/ns/mnt", info.ServerPID)
	var mine, server unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &mine); err != nil {
		return fmt.Errorf("this command's mount namespace: %w", err)
	}
	if err := unix.Stat(theirs, &server); err != nil {
		return fmt.Errorf("the server's mount namespace: %w", err)
	}
	if mine.Dev == server.Dev && mine.Ino == server.Ino {
		return nil
	}
	fd, err := unix.Open(theirs, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the server's mount namespace: %w", err)
	}
	defer unix.Close(fd)
	// A thread shares its root and working directory with the others
	// until it unshares them; only then may it change mount namespace.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("a filesystem context of its own: %w", err)
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the server's mount namespace: %w", err)
	}
	return nil
}

// forwardSignals passes the signals a user sends to stop a command on to
// pid, until stop is called.
func forwardSignals(pid int) (stop func()) {
	c := make(chan os.Signal, 4)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-c:
				syscall.Kill(pid, s.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(c); close(done) }
}

func statusCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// sandboxInit is stage 2: PID 1 of the sandbox's PID namespace, root in
// fresh mount, UTS and IPC namespaces, already in the agent's network
// namespace. It never returns without an error: it exits with the
// command's status.
func sandboxInit() error {
	specFile := os.NewFile(specFd, "spec")
	var spec stage2Spec
	err := json.NewDecoder(io.LimitReader(specFile, 1<<20)).Decode(&spec)
	specFile.Close() // nothing but stdin, stdout and stderr reaches the command
	if err != nil {
		return fmt.Errorf("sandbox: read its spec (%s is started by exec, not by hand): %w", sandboxInitCommand, err)
	}
	if os.Getpid() != 1 {
		return errors.New("sandbox: not in a PID namespace of its own")
	}
	info := spec.Info
	if info.UID == 0 || info.GID == 0 {
		return errors.New("sandbox: refusing to run a command as root")
	}
	if len(spec.Argv) == 0 {
		return errors.New("sandbox: no command")
	}
	// Descriptors that stage 1 inherited from whoever ran it (a shell's
	// pipes, say) must not reach the command.
	if err := closeOnExecAll(); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	runtime.LockOSThread() // the privileges are dropped on this thread, and the command forks from it
	pts := os.NewFile(ptsFd, "devpts")
	err = confineMounts(info, pts)
	pts.Close()
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := unix.Sethostname([]byte(info.Agent)); err != nil {
		return fmt.Errorf("sandbox: hostname: %w", err)
	}
	// A session keyring of its own: the caller's (a login's) holds the
	// operator's keys, and would carry keys from one sandbox to another.
	if _, _, errno := unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); errno != 0 {
		return fmt.Errorf("sandbox: a session keyring of its own: %w", errno)
	}
	if err := limitResources(info); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := dropPrivileges(); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if err := noUserNamespaces(); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	env := sandboxEnvFor(info, spec.Term)
	path, err := lookPath(spec.Argv[0], env)
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{
		Path: path, Args: spec.Argv, Env: env, Dir: sandboxHome(info),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: info.UID, Gid: info.GID, Groups: []uint32{}},
			// A session of its own: the operator's terminal is never its
			// controlling one (TIOCSTI); its own pseudo-terminal is.
			Setsid:    true,
			Setctty:   spec.TTYFd >= 0,
			Ctty:      max(spec.TTYFd, 0),
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	stop := forwardSignals(cmd.Process.Pid)
	defer stop()
	// As PID 1, reap every orphan until the command itself exits.
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sandbox: wait: %w", err)
		}
		if pid == cmd.Process.Pid {
			os.Exit(statusCode(syscall.WaitStatus(ws)))
		}
	}
}

// closeOnExecAll marks every descriptor above stderr close-on-exec.
func closeOnExecAll() error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd) // the directory's own descriptor is gone by now: EBADF is fine
		}
	}
	return nil
}

// sandboxHome is where the agent's home appears inside the sandbox.
func sandboxHome(info ExecInfo) string { return "/home/" + info.Agent }

// sandboxEnvFor is the command's whole environment: the server's variables
// for the agent (placeholders, proxy, CA files) and the basics of a login.
func sandboxEnvFor(info ExecInfo, term string) []string {
	if term == "" {
		term = "dumb"
	}
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + sandboxHome(info), "USER=" + info.Agent, "LOGNAME=" + info.Agent,
		"TERM=" + term, "LANG=C.UTF-8",
	}
	return append(env, info.Env...)
}

// lookPath finds a command by the sandbox's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("sandbox: %s: %w%s", name, err, privateHint(name))
		}
		return name, nil
	}
	for _, kv := range env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range filepath.SplitList(p) {
				full := filepath.Join(dir, name)
				if st, err := os.Stat(full); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
					return full, nil
				}
			}
		}
	}
	return "", fmt.Errorf("sandbox: %s: command not found", name)
}

// privateHint says why a path under a scratch directory is not there: the
// sandbox's is its own, empty at start.
func privateHint(path string) string {
	for _, d := range scratchDirs {
		if path == d.dir || strings.HasPrefix(path, d.dir+"/") {
			return fmt.Sprintf(" (%s is private to each sandbox, empty at its start: the host's is not seen; put the command in the agent's home or in the host's tree, /usr/local/bin)", d.dir)
		}
	}
	return ""
}

// limitResources sets the limits the command inherits. The kernel counts
// RLIMIT_NPROC per real uid, and no agent shares its uid, so the bound
// holds for the agent across all its sandboxes; it applies to the command
// once it runs as that uid (stage 2, root, is exempt). A zero limit (an
// ExecInfo without them) is refused rather than taken for none.
//
// Memory has no limit here, so the sandbox is what the kernel's OOM
// killer takes first (oom_score_adj 1000, which the command, without
// CAP_SYS_RESOURCE, cannot lower when stage 2 holds that capability, as
// root on a host does): a sandbox that fills the host's memory loses its
// own processes, not the gateway (whose unit sets -900).
func limitResources(info ExecInfo) error {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0); err != nil {
		return fmt.Errorf("make the sandbox the OOM killer's first choice: %w", err)
	}
	for _, l := range []struct {
		name     string
		resource int
		n        int
	}{
		{"processes", unix.RLIMIT_NPROC, info.MaxProcesses},
		{"open files", unix.RLIMIT_NOFILE, info.MaxOpenFiles},
	} {
		if l.n < 1 {
			return fmt.Errorf("no limit of %s given", l.name)
		}
		// syscall's Setrlimit, so that the command gets this limit rather
		// than the one Go found at its start.
		if err := syscall.Setrlimit(l.resource, &syscall.Rlimit{Cur: uint64(l.n), Max: uint64(l.n)}); err != nil {
			return fmt.Errorf("limit %s to %d: %w", l.name, l.n, err)
		}
	}
	return nil
}

// dropPrivileges leaves the calling thread (and whatever it starts) no
// way back to privilege: no_new_privs, an empty bounding set, no ambient
// or inheritable capability. The command's change of uid then clears the
// permitted and effective sets.
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	return nil
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read the last capability: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// childEnv is the whole environment of every program agenthold starts:
// nothing of its own (AGENTHOLD_MASTER_KEY least of all) but a PATH, the
// switch that lets a test binary stand in for agenthold, and the race
// detector's options for such a binary.
func childEnv() []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, k := range []string{testAsCLIEnv, "GORACE"} {
		if v := os.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// testAsCLIEnv makes a test binary run as agenthold's command line (see
// TestMain), so that exec's second stage and the demo's server work from
// tests.
const testAsCLIEnv = "AGENTHOLD_TEST_AS_CLI"

// killSandboxes ends the processes in an agent's network namespace: every
// one when agenthold made the namespace, and the sandboxes exec started
// in one it adopted (a container's own processes are its runtime's). An
// agent's deletion thereby ends its running sandboxes rather than leaving
// them with their uid and files.
func killSandboxes(nsPath string, created bool) {
	ns, err := os.Stat(nsPath)
	if err != nil {
		return
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		st, err := os.Stat(filepath.Join("/proc", e.Name(), "ns", "net"))
		if err != nil || !os.SameFile(st, ns) {
			continue
		}
		if created || isSandboxInit(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// isSandboxInit reports whether pid is exec's second stage, PID 1 of a
// sandbox (killing it ends the whole sandbox).
func isSandboxInit(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return len(args) > 1 && args[1] == sandboxInitCommand
}
