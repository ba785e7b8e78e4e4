//go:build linux

package fastpath

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// watcher tells running pairs of changes to their second socket: one
// epoll instance and one goroutine for a Path, so that a pair waits for
// both its ends in its caller's goroutine alone, and an idle connection
// on the kernel path holds no goroutine of its own. The first socket is
// waited on through Go's poller, which a Close wakes too; an epoll
// registration, by contrast, goes silently with a closed socket.
type watcher struct {
	ep, stop int // the epoll instance; an eventfd that ends the loop
	done     chan struct{}

	mu    sync.Mutex
	next  uint64
	wakes map[uint64]func()
}

// stopKey is the stop eventfd's key in the epoll set; sockets' keys
// start after it.
const stopKey = 0

func newWatcher() (*watcher, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fastpath: epoll: %w", err)
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("fastpath: eventfd: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, stop, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(ep)
		unix.Close(stop)
		return nil, fmt.Errorf("fastpath: epoll: %w", err)
	}
	w := &watcher{ep: ep, stop: stop, done: make(chan struct{}), next: stopKey + 1, wakes: map[uint64]func(){}}
	go w.loop()
	return w, nil
}

// loop calls the wake of each socket whose state changed, until close.
func (w *watcher) loop() {
	defer close(w.done)
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(w.ep, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if key == stopKey {
				return
			}
			w.mu.Lock()
			wake := w.wakes[key]
			w.mu.Unlock()
			if wake != nil {
				wake()
			}
		}
	}
}

// add calls wake, in the watcher's goroutine, whenever c becomes
// readable, is shut down by its peer or fails, until remove.
func (w *watcher) add(c *net.TCPConn, wake func()) (remove func(), err error) {
	w.mu.Lock()
	key := w.next
	w.next++
	w.wakes[key] = wake
	w.mu.Unlock()
	forget := func() {
		w.mu.Lock()
		delete(w.wakes, key)
		w.mu.Unlock()
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(uint32(key)), Pad: int32(uint32(key >> 32))}
	if err := withFD(c, func(fd int) error { return unix.EpollCtl(w.ep, unix.EPOLL_CTL_ADD, fd, &ev) }); err != nil {
		forget()
		return nil, fmt.Errorf("fastpath: epoll: %w", err)
	}
	return func() {
		// Through the connection: once it is closed, it has left the
		// epoll set, and its descriptor's number may be another's.
		withFD(c, func(fd int) error { return unix.EpollCtl(w.ep, unix.EPOLL_CTL_DEL, fd, nil) })
		forget()
	}, nil
}

// close ends the loop and releases the epoll instance.
func (w *watcher) close() {
	one := [8]byte{1}
	unix.Write(w.stop, one[:])
	<-w.done
	unix.Close(w.ep)
	unix.Close(w.stop)
}
