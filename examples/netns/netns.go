//go:build linux

// Package netns creates and uses named network namespaces (the ones `ip
// netns` manages) for tests and for the example programs: namespaces,
// veth pairs between them, commands and Go code run inside them.
//
// It drives iproute2's ip command, which every Linux machine this project
// targets has, and setns(2) for Go code. Everything needs root.
package netns

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// NS is a named network namespace.
type NS struct {
	Name string
}

// Unique returns prefix followed by random hex, at most 15 bytes long so
// that it can also name an interface.
func Unique(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	s := prefix + hex.EncodeToString(b)
	if len(s) > 15 {
		s = s[len(s)-15:]
	}
	return s
}

// Add creates a namespace with its loopback up.
func Add(name string) (*NS, error) {
	if err := IP("netns", "add", name); err != nil {
		return nil, err
	}
	n := &NS{Name: name}
	if err := n.IP("link", "set", "lo", "up"); err != nil {
		n.Delete()
		return nil, err
	}
	return n, nil
}

// AddOrAdopt returns the namespace name, creating it unless it is already
// mounted; a file left at its path by a namespace that is gone (its
// creator's mount namespace died with it) is removed first.
func AddOrAdopt(name string) (*NS, error) {
	n := &NS{Name: name}
	if IsMounted(n.Path()) {
		return n, n.IP("link", "set", "lo", "up")
	}
	if err := os.Remove(n.Path()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("netns: remove the stale %s: %w", n.Path(), err)
	}
	return Add(name)
}

// IsMounted reports whether path is a network namespace (a bind mount of
// one, as `ip netns add` makes), rather than an ordinary file.
func IsMounted(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// List returns the names of the namespaces in /run/netns.
func List() ([]string, error) {
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, err
}

// Current returns the name under /run/netns of the caller's network
// namespace, or "" if it has none (the host's, say).
func Current() string {
	self, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return ""
	}
	names, _ := List()
	for _, n := range names {
		if st, err := os.Stat(filepath.Join("/run/netns", n)); err == nil && os.SameFile(self, st) {
			return n
		}
	}
	return ""
}

// Links returns the names of the caller's network interfaces.
func Links() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ifs))
	for i, f := range ifs {
		names[i] = f.Name
	}
	return names, nil
}

// LinkExists reports whether the caller's namespace has an interface name.
// It asks for that one interface (SIOCGIFINDEX): net.InterfaceByName
// lists them all, which a gateway of a thousand agents' links would pay
// on every agent it adds.
func LinkExists(name string) bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return false
	}
	return unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr) == nil
}

// Path is the namespace's bind mount, for setns or nftables.
func (n *NS) Path() string { return filepath.Join("/run/netns", n.Name) }

// Delete removes the namespace (and with it its interfaces and nftables
// tables) and its /etc/netns files.
func (n *NS) Delete() error {
	os.RemoveAll(filepath.Join("/etc/netns", n.Name))
	return IP("netns", "delete", n.Name)
}

// IP runs `ip -n NAME args...`.
func (n *NS) IP(args ...string) error {
	return IP(append([]string{"-n", n.Name}, args...)...)
}

// IPBatch runs commands, each the arguments of one `ip -n NAME` command,
// in one `ip` process, stopping at the first that fails.
func (n *NS) IPBatch(commands ...[]string) error {
	return IPBatch(append([]string{"-n", n.Name}, "-batch", "-"), commands...)
}

// Command returns a command that runs inside the namespace.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	cmd.Env = minimalEnv
	return cmd
}

// minimalEnv is the whole environment of the commands this package runs:
// none of the caller's variables (a master key, say) reaches them.
var minimalEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Run runs a command inside the namespace and returns its combined output.
func (n *NS) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// SetResolvConf writes the resolv.conf that programs run through `ip netns
// exec` see.
func (n *NS) SetResolvConf(content string) error {
	dir := filepath.Join("/etc/netns", n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(content), 0o644)
}

// Sysctl sets a per-namespace sysctl inside the namespace, such as
// net.ipv4.ip_forward=0, by writing /proc/sys from a process inside it.
func (n *NS) Sysctl(setting string) error {
	key, value, ok := strings.Cut(setting, "=")
	if !ok || strings.ContainsAny(key, "/ ") || strings.Contains(key, "..") {
		return fmt.Errorf("netns: bad sysctl %q", setting)
	}
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	_, err := n.Run(context.Background(), "sh", "-c", `printf '%s\n' "$1" > "$2"`, "sh", value, path)
	return err
}

// Do runs f on an OS thread that is inside the namespace. Sockets f
// creates belong to the namespace and may be used from any goroutine
// afterwards. The thread goes back to its own namespace when f returns,
// or, if it cannot, is discarded. (Going back matters: a goroutine that
// exits locked to the process's main thread does not end that thread,
// and the main thread's namespace is the one /proc/PID/ns/net shows, so
// the whole process would seem to live in the namespace.)
func (n *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("netns: this thread's namespace: %w", err)
			return
		}
		defer unix.Close(home)
		fd, err := unix.Open(n.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("netns: open %s: %w", n.Name, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netns: enter %s: %w", n.Name, err)
			return
		}
		err = f()
		if unix.Setns(home, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // home again: the thread may serve others
		}
		errc <- err
	}()
	return <-errc
}

// Veth connects two namespaces with a veth pair, aName in a and bName in
// b, both up.
func Veth(a *NS, aName string, b *NS, bName string) error {
	if err := a.IP("link", "add", aName, "type", "veth", "peer", "name", bName, "netns", b.Name); err != nil {
		return err
	}
	if err := a.IP("link", "set", aName, "up"); err != nil {
		return err
	}
	return b.IP("link", "set", bName, "up")
}

// IP runs the ip command in the caller's namespace.
func IP(args ...string) error { return runIP(args, nil) }

// runIP runs `ip args...` with stdin, if any, on its standard input.
func runIP(args []string, stdin io.Reader) error {
	cmd := exec.Command("ip", args...)
	cmd.Env = minimalEnv
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// IPBatch runs `ip OPTIONS...` once, with commands (each the arguments of
// one ip command, none holding a space) on its standard input: one
// process, and one switch of namespace, for them all, where each is
// otherwise a process of its own, whose cost grows with the host's
// mounts.
func IPBatch(options []string, commands ...[]string) error {
	var script strings.Builder
	for _, c := range commands {
		script.WriteString(strings.Join(c, " "))
		script.WriteByte('\n')
	}
	return runIP(options, strings.NewReader(script.String()))
}

// ErrNotRoot is returned by Available when namespaces cannot be made.
var ErrNotRoot = errors.New("netns: requires root")

// Available reports whether this process can create namespaces.
func Available() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("netns: the ip command (iproute2) is missing: %w", err)
	}
	return nil
}
