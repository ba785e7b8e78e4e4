//go:build linux

package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// sandboxStdio is what the sandbox gets as stdin, stdout and stderr. The
// operator's own descriptors never reach it where they would give it more
// than a stream of bytes:
//
//   - a terminal becomes a pseudo-terminal of the sandbox's own, relayed,
//     with the operator's terminal in raw mode meanwhile and restored
//     after: the sandbox cannot read keystrokes typed after it was put in
//     the background, nor leave the terminal's settings changed;
//   - a regular file becomes a pipe, relayed: the sandbox cannot reopen
//     the operator's file (through /proc/self/fd) to read what it held.
//
// Pipes, sockets and character devices pass as they are; anything else
// (a directory, a block device) is refused.
type sandboxStdio struct {
	files    [3]*os.File    // what stage 2 gets
	ttyFd    int            // which of them is the pty, to be the command's controlling terminal; -1 for none
	theirs   []*os.File     // stage 1's copies of the sandbox's ends, closed once it started
	outputs  sync.WaitGroup // the output relays, which the end waits for
	restore  func()
	stopWinc func()
}

// newSandboxStdio prepares the sandbox's stdio from this process's; a
// terminal's pty comes from the sandbox's own devpts instance pts.
func newSandboxStdio(pts *os.File) (*sandboxStdio, error) {
	s := &sandboxStdio{ttyFd: -1, restore: func() {}, stopWinc: func() {}}
	std := [3]*os.File{os.Stdin, os.Stdout, os.Stderr}
	var pty, tty *os.File // the sandbox's end, and the operator's terminal
	for i, f := range std {
		switch {
		case isTerminal(f):
			if pty == nil {
				master, slave, err := openPTY(pts)
				if err != nil {
					s.close()
					return nil, err
				}
				pty, tty = slave, f
				s.theirs = append(s.theirs, slave)
				s.ttyFd = i
				s.relayPTY(master, std)
			}
			s.files[i] = pty
		case isRegular(f):
			r, w, err := os.Pipe()
			if err != nil {
				s.close()
				return nil, err
			}
			if i == 0 {
				s.files[i] = r
				s.theirs = append(s.theirs, r)
				s.relay(w, f, false)
			} else {
				s.files[i] = w
				s.theirs = append(s.theirs, w)
				s.relay(f, r, true)
			}
		case isStream(f):
			s.files[i] = f
		default:
			s.close()
			return nil, fmt.Errorf("standard %s is neither a terminal, a file, a pipe, a socket nor a character device: refused, a directory there would give the sandbox a way into this host's files", stdName[i])
		}
	}
	if pty != nil {
		copyTermState(tty, pty)
		s.followWindowSize(tty, pty)
		if isTerminal(os.Stdin) {
			s.restore = makeRaw(os.Stdin)
		}
	}
	return s, nil
}

// relay copies src to dst in the background. An output relay is waited
// for at the end, and closes its source then; an input relay closes its
// destination, so that the sandbox sees the end of its input.
func (s *sandboxStdio) relay(dst, src *os.File, output bool) {
	if !output {
		go func() {
			io.Copy(dst, src)
			dst.Close()
		}()
		return
	}
	s.outputs.Add(1)
	go func() {
		defer s.outputs.Done()
		io.Copy(dst, src)
		src.Close()
	}()
}

// relayPTY relays the operator's terminal and the pty's master: typed
// input in, the sandbox's terminal output out, to the first of stdout,
// stderr and stdin that is a terminal. Every byte the sandbox has the
// operator's terminal show passes terminalFilter here.
func (s *sandboxStdio) relayPTY(master *os.File, std [3]*os.File) {
	out := std[0]
	for _, f := range []*os.File{std[1], std[2]} {
		if isTerminal(f) {
			out = f
			break
		}
	}
	if isTerminal(std[0]) {
		go io.Copy(master, std[0]) // ends with the process: a read of a terminal cannot be interrupted
	}
	s.outputs.Add(1)
	go func() {
		defer s.outputs.Done()
		io.Copy(newTerminalFilter(out), master) // until the sandbox's last end of the pty closes (EIO)
		master.Close()
	}()
}

// started closes stage 1's copies of the sandbox's ends, so that their
// relays see the end when the sandbox's close.
func (s *sandboxStdio) started() {
	for _, f := range s.theirs {
		f.Close()
	}
	s.theirs = nil
}

// finish waits for the output to be relayed and gives the operator's
// terminal back.
func (s *sandboxStdio) finish() {
	s.started()
	s.outputs.Wait()
	s.stopWinc()
	s.restore()
}

func (s *sandboxStdio) close() {
	s.started()
	s.stopWinc()
	s.restore()
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// stdName names the standard descriptors.
var stdName = [3]string{"input", "output", "error"}

// isStream reports whether f is a pipe, a socket or a character device:
// a stream of bytes and nothing more, which the sandbox may have as it
// is. A directory (a handle into this host's mount namespace, past every
// mount the sandbox's is made of) or a block device is not.
func isStream(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeCharDevice) != 0
}

func isRegular(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode().IsRegular()
}

// copyTermState gives the pty the operator's terminal settings and size.
func copyTermState(from, to *os.File) {
	if t, err := unix.IoctlGetTermios(int(from.Fd()), unix.TCGETS); err == nil {
		unix.IoctlSetTermios(int(to.Fd()), unix.TCSETS, t)
	}
	if ws, err := unix.IoctlGetWinsize(int(from.Fd()), unix.TIOCGWINSZ); err == nil {
		unix.IoctlSetWinsize(int(to.Fd()), unix.TIOCSWINSZ, ws)
	}
}

// followWindowSize passes the operator's window size on as it changes.
func (s *sandboxStdio) followWindowSize(from, to *os.File) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-c:
				if ws, err := unix.IoctlGetWinsize(int(from.Fd()), unix.TIOCGWINSZ); err == nil {
					unix.IoctlSetWinsize(int(to.Fd()), unix.TIOCSWINSZ, ws)
				}
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	s.stopWinc = func() { once.Do(func() { signal.Stop(c); close(done) }) }
}

// makeRaw puts a terminal in raw mode (every key, Ctrl-C included, goes to
// the sandbox's own terminal) and returns what restores it.
func makeRaw(f *os.File) func() {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return func() {}
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	unix.IoctlSetTermios(fd, unix.TCSETS, &raw)
	var once sync.Once
	return func() { once.Do(func() { unix.IoctlSetTermios(fd, unix.TCSETS, old) }) }
}
