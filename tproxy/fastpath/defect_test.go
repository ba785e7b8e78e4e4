//go:build linux

package fastpath

import (
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// BenchmarkScatteredSegments runs the traffic ErrSockmapDefect names and
// reports the share of uploads that did not come out whole: on the
// kernel path, on it with every byte left to user space (a bound of one
// byte on what may be queued: nothing is redirected, and what breaks is
// the kernel's receive path for a socket in a sockmap alone), and
// through a splicing relay, in turn. A server sends one-byte segments
// scattered through its pages (each followed by a byte to another
// connection, from the same thread) to a client that reads none of them,
// while the client uploads 256 MiB. A kernel free of the defect shows 0
// on the kernel path:
// go test -run X -bench ScatteredSegments -benchtime 8x ./tproxy/fastpath
func BenchmarkScatteredSegments(b *testing.B) {
	p := newPath(b)
	ways := []struct {
		name   string
		kernel bool
		bound  int64
	}{{"kernel", true, DefaultMaxQueuedTotal}, {"passed", true, 1}, {"splice", false, 0}}
	broken := make([]int, len(ways))
	for range b.N {
		for k, w := range ways {
			if w.kernel {
				require.NoError(b, p.SetMaxQueuedTotal(w.bound))
			}
			if err := scatteredUpload(b, p, w.kernel); err != nil {
				b.Logf("%s: %v", w.name, err)
				broken[k]++
			}
		}
	}
	for k, w := range ways {
		b.ReportMetric(float64(broken[k])/float64(b.N), w.name+"-broken/op")
	}
}

// TestScatteredSegmentsThroughASplicingRelay: the traffic that breaks
// the kernel path leaves a stream relayed by splicing whole.
func TestScatteredSegmentsThroughASplicingRelay(t *testing.T) {
	for range 3 {
		assert.NoError(t, scatteredUpload(t, nil, false))
	}
}

// scatteredUpload sends ErrSockmapDefect's traffic between a client and
// a server, through p's kernel path or a splicing relay, and says how
// the upload did not arrive whole, if it did not.
func scatteredUpload(tb testing.TB, p *Path, kernel bool) error {
	const up = 256 << 20
	client, a, b, server := pairUp(tb)
	ran := make(chan struct{})
	if kernel {
		pr, err := p.Splice(a, b)
		require.NoError(tb, err)
		defer pr.Remove()
		go func() { pr.Run(a, b); close(ran) }()
	} else {
		var relays sync.WaitGroup
		relays.Go(func() { io.Copy(b, a) })
		relays.Go(func() { io.Copy(a, b) })
		go func() { relays.Wait(); close(ran) }()
	}
	_, _, other, sink := pairUp(tb)
	go io.Copy(io.Discard, sink)

	stop := make(chan struct{})
	var download sync.WaitGroup
	download.Go(func() { // never read by the client
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var fd, ofd int
		withFD(server, func(f int) error { fd = f; return nil })
		withFD(other, func(f int) error { ofd = f; return nil })
		for off := 0; off < 2<<20; {
			select {
			case <-stop:
				return
			default:
			}
			if n, err := unix.Write(fd, []byte{streamByte(off)}); err == nil {
				off += n
				unix.Write(ofd, []byte{0})
			} else if err != unix.EAGAIN {
				return
			}
			for spin := time.Now(); time.Since(spin) < 5*time.Microsecond; {
			}
		}
	})
	time.Sleep(time.Second)
	go sendStream(client, 0, up, 15*time.Second)
	_, err := readStream(server, 0, up, 20*time.Second)
	close(stop)
	download.Wait() // before the sockets close: their descriptors may be reused
	for _, c := range []*net.TCPConn{client, a, b, server} {
		c.SetLinger(0)
		c.Close()
	}
	<-ran
	return err
}
