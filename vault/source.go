package vault

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// Source is where a secret's value comes from when the vault does not
// keep it: a file another tool keeps fresh (a mounted Kubernetes Secret),
// or a command the gateway runs that prints a short-lived token (gh auth
// token, a cloud CLI). The value, without its final newline, is read when
// first needed and kept in memory only; it goes where the secret's rule
// says, as a stored value does, and never into a record, an error or a
// log.
type Source struct {
	// File is an absolute path, read again when it changes (it is looked
	// at, at most once a second, when the value is used). It must be
	// owned by root or the gateway's user and readable by no other user
	// (0600 or 0400, a Secret volume's defaultMode 0400).
	File string `json:"file,omitempty"`
	// Command is an absolute path and its arguments, run without a shell;
	// its standard output is the value.
	Command []string `json:"command,omitempty"`
	// Refresh is how old a command's value may get before the command
	// runs again, in the background; zero means DefaultSourceRefresh.
	Refresh time.Duration `json:"refresh,omitempty"`
	// Timeout bounds one run of the command; zero means
	// DefaultSourceTimeout.
	Timeout time.Duration `json:"timeout,omitempty"`
	// MaxStale is how long the last good value still serves once the
	// source fails (a file gone, a command failing); after it, the secret
	// is refused with the reason. Zero means DefaultSourceMaxStale.
	MaxStale time.Duration `json:"max_stale,omitempty"`
}

// Defaults of a Source's zero fields.
const (
	DefaultSourceRefresh  = 5 * time.Minute
	DefaultSourceTimeout  = 10 * time.Second
	DefaultSourceMaxStale = 15 * time.Minute
	// maxSourceValue bounds what is read from a file or a command.
	maxSourceValue = 64 << 10
	// fileCheckEvery is how often a file source is looked at for a change.
	fileCheckEvery = time.Second
	// sourceRetry bounds how soon a failed command runs again.
	sourceRetry = 10 * time.Second
)

func (s *Source) check() error {
	switch {
	case (s.File == "") == (len(s.Command) == 0):
		return errors.New("a source is a file or a command, one of them")
	case s.File != "" && !filepath.IsAbs(s.File):
		return fmt.Errorf("source file %q: want an absolute path", s.File)
	case len(s.Command) > 0 && !filepath.IsAbs(s.Command[0]):
		return fmt.Errorf("source command %q: want an absolute path", s.Command[0])
	case s.Refresh < 0 || s.Timeout < 0 || s.MaxStale < 0:
		return errors.New("source: refresh, timeout and max_stale must not be negative")
	}
	return nil
}

func orDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// sourceState is a source's value in memory, and how it was last read.
type sourceState struct {
	spec  Source
	check func(string) error // the rule's check of a value
	clock func() time.Time   // the vault's

	mu         sync.Mutex
	value      []byte    // the last good value; nil before the first
	gen        uint64    // counts values, so that what is built on one (a redactor) is built again
	good       time.Time // when the source last gave (or, a file, confirmed) the value
	failure    error     // why the source last failed, if it did since
	failedAt   time.Time
	retryAt    time.Time   // a command that failed runs again no sooner
	looked     time.Time   // a file's last look
	fileID     fileVersion // and what it saw
	refreshing bool        // a command is running in the background
}

// fileVersion tells one content of a file from the next without reading
// it: a rotated Kubernetes Secret is a new file behind the same path.
type fileVersion struct {
	ino, size int64
	mtime     time.Time
}

// current returns a copy of the value and its generation: the source is
// read first if it never was, or if it changed; a value older than the
// source's failure by more than MaxStale is refused.
func (s *sourceState) current(now time.Time) ([]byte, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spec.File != "" {
		if s.value == nil || now.Sub(s.looked) >= fileCheckEvery {
			s.lookAtFile(now)
		}
	} else if s.value == nil && !now.Before(s.retryAt) {
		value, err := s.runCommand()
		s.took(value, err, now)
	} else if s.value != nil && now.Sub(s.good) >= orDuration(s.spec.Refresh, DefaultSourceRefresh) && !now.Before(s.retryAt) && !s.refreshing {
		s.refreshing = true
		go s.refresh()
	}
	if s.value == nil {
		return nil, 0, fmt.Errorf("its source gave no value: %w", s.failure)
	}
	if s.failure != nil && now.Sub(s.good) > orDuration(s.spec.MaxStale, DefaultSourceMaxStale) {
		return nil, 0, fmt.Errorf("its source has failed since %s, and its last value is too old: %w", s.failedAt.UTC().Format(time.RFC3339), s.failure)
	}
	return bytes.Clone(s.value), s.gen, nil
}

// took keeps a value read at now, or the reason it could not be.
func (s *sourceState) took(value []byte, err error, now time.Time) {
	if err == nil {
		err = s.check(string(value))
	}
	if err != nil {
		if s.failure == nil {
			s.failedAt = now
		}
		s.failure = err
		// A failing command runs again no sooner than this, however
		// many requests need it meanwhile.
		s.retryAt = now.Add(min(orDuration(s.spec.Refresh, DefaultSourceRefresh), sourceRetry))
		clear(value)
		return
	}
	if !bytes.Equal(value, s.value) {
		clear(s.value)
		s.value = value
		s.gen++
	} else {
		clear(value)
	}
	s.good, s.failure = now, nil
}

// lookAtFile reads the file if it changed since the last look.
func (s *sourceState) lookAtFile(now time.Time) {
	s.looked = now
	fi, err := os.Stat(s.spec.File)
	if err != nil {
		s.took(nil, fmt.Errorf("source file: %w", unwrapPath(err)), now)
		return
	}
	id := fileVersion{ino: inode(fi), size: fi.Size(), mtime: fi.ModTime()}
	if s.value != nil && id == s.fileID {
		s.good, s.failure = now, nil
		return
	}
	if err := trustedFile(s.spec.File); err != nil {
		s.took(nil, err, now)
		return
	}
	value, err := readValue(s.spec.File)
	if err == nil {
		s.fileID = id
	}
	s.took(value, err, now)
}

// readValue reads a file's value: at most maxSourceValue bytes, without
// the final newline.
func readValue(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("source file: %w", unwrapPath(err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSourceValue+1))
	if err != nil {
		return nil, fmt.Errorf("source file: %w", err)
	}
	return trimValue(b)
}

func trimValue(b []byte) ([]byte, error) {
	if len(b) > maxSourceValue {
		clear(b)
		return nil, fmt.Errorf("source: the value is over %d bytes", maxSourceValue)
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) == 0 {
		return nil, errors.New("source: empty value")
	}
	return b, nil
}

// runCommand runs the command once, bounded by its timeout. What it
// printed is never part of an error: only how it ended.
func (s *sourceState) runCommand() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), orDuration(s.spec.Timeout, DefaultSourceTimeout))
	defer cancel()
	var out limitedBuffer
	cmd := exec.CommandContext(ctx, s.spec.Command[0], s.spec.Command[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &out, io.Discard, os.Environ()
	cmd.WaitDelay = time.Second
	ownProcessGroup(cmd) // at its timeout, what it started is killed too
	err := cmd.Run()
	switch {
	case ctx.Err() != nil:
		clear(out.b)
		return nil, fmt.Errorf("source command %s: timed out", filepath.Base(s.spec.Command[0]))
	case err != nil:
		clear(out.b)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return nil, fmt.Errorf("source command %s: %s", filepath.Base(s.spec.Command[0]), exit.ProcessState)
		}
		return nil, fmt.Errorf("source command %s: %w", filepath.Base(s.spec.Command[0]), unwrapPath(err))
	case out.over:
		clear(out.b)
		return nil, fmt.Errorf("source command %s: printed over %d bytes", filepath.Base(s.spec.Command[0]), maxSourceValue)
	}
	return trimValue(out.b)
}

// refresh runs the command in the background, and keeps what it gives.
func (s *sourceState) refresh() {
	value, err := s.runCommand()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshing = false
	s.took(value, err, s.clock())
}

// limitedBuffer keeps at most maxSourceValue bytes, and says if there
// were more.
type limitedBuffer struct {
	b    []byte
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > maxSourceValue {
		l.over = true
		return len(p), nil
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

// unwrapPath is a path error's cause without its path, or err.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
