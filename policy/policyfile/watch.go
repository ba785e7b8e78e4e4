package policyfile

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/agenthold/egress/policy"
)

// Watcher keeps the policy of one file current. It watches the file's
// directory, so a file that is replaced by rename, or deleted and created
// again (how Kubernetes updates an emptyDir or a ConfigMap volume), is
// still followed; it also re-reads the file every resync interval in case
// an event is lost.
//
// Every step fails closed: until the first successful load, and after any
// failed one, the policy denies everything. A bad edit after a good one
// does not keep the old policy, and never falls back to anything more open.
type Watcher struct {
	path    string
	log     *slog.Logger
	onLoad  func(*policy.Policy, error)
	current atomic.Pointer[policy.Policy]
	fsw     *fsnotify.Watcher
	resync  time.Duration

	mu     sync.Mutex // guards loaded and state
	loaded bool
	state  [32]byte // hash of the file loaded, or of the error

	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// DefaultResync is how often a watched file is read again even without
// an event, in case one was missed.
const DefaultResync = 5 * time.Second

// WatchConfig configures a Watcher. The zero value is usable.
type WatchConfig struct {
	// Logger receives one line per change of policy; nil discards.
	Logger *slog.Logger
	// OnLoad is called after the first load and every load that changes
	// the policy, with the new policy and the load error (nil on success).
	OnLoad func(*policy.Policy, error)
	// Resync is the interval of the safety re-read; zero means
	// DefaultResync.
	Resync time.Duration
}

// Watch loads the policy file at path and keeps it current until Close.
// The directory of path must exist; the file need not.
func Watch(path string, cfg WatchConfig) (*Watcher, error) {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("policy: watch: %w", err)
	}
	if err := fsw.Add(filepath.Dir(path)); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("policy: watch %s: %w", filepath.Dir(path), err)
	}
	w := &Watcher{
		path:   path,
		log:    cfg.Logger,
		onLoad: cfg.OnLoad,
		fsw:    fsw,
		resync: cfg.Resync,
		done:   make(chan struct{}),
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.resync <= 0 {
		w.resync = DefaultResync
	}
	w.current.Store(policy.Deny(ReasonFileAbsent))
	w.reload()
	w.wg.Add(1)
	go w.run()
	return w, nil
}

// Policy returns the current policy; never nil.
func (w *Watcher) Policy() *policy.Policy { return w.current.Load() }

// Close stops watching. The last policy stays readable.
func (w *Watcher) Close() error {
	var err error
	w.closeOnce.Do(func() {
		close(w.done)
		err = w.fsw.Close()
		w.wg.Wait()
	})
	return err
}

// debounce is how long the watcher waits after an event for more, so that
// a burst (truncate, write, rename) loads once.
const debounce = 20 * time.Millisecond

func (w *Watcher) run() {
	defer w.wg.Done()
	resync := time.NewTicker(w.resync)
	defer resync.Stop()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	for {
		select {
		case <-w.done:
			return
		case _, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			settle.Reset(debounce)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// An overflow means events were lost: re-read now.
			w.log.Warn("policy watch error; re-reading", "path", w.path, "err", err)
			settle.Reset(debounce)
		case <-settle.C:
			w.reload()
		case <-resync.C:
			w.reload()
		}
	}
}

// reload reads the file and swaps the policy in if the file, or the
// reason it cannot be loaded, changed.
func (w *Watcher) reload() {
	p, data, err := load(w.path)
	state := sha256.Sum256(data)
	if err != nil {
		state = sha256.Sum256([]byte("error\x00" + err.Error()))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.loaded && state == w.state {
		return
	}
	w.loaded, w.state = true, state
	w.current.Store(p)
	if err != nil {
		w.log.Warn("policy denies all", "path", w.path, "reason", p.DenyReason(), "err", err)
	} else {
		w.log.Info("policy loaded", "path", w.path, "mode", p.Mode(), "entries", p.Len(), "deny_reason", p.DenyReason())
	}
	if w.onLoad != nil {
		w.onLoad(p, err)
	}
}
