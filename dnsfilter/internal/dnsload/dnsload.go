// Package dnsload is a small DNS load generator for benchmarks: workers
// each keep one UDP query in flight against a server and count answers.
package dnsload

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Result is what one run measured.
type Result struct {
	Answered int           // queries answered
	Lost     int           // queries that timed out
	Elapsed  time.Duration // wall time of the run
}

// QPS is answered queries per second.
func (r Result) QPS() float64 { return float64(r.Answered) / r.Elapsed.Seconds() }

// Run sends n copies of query (a packed DNS message; the ID is rewritten
// per query) to addr from workers sockets, each waiting for its answer (at
// most timeout) before sending the next. It stops early at deadline.
func Run(addr string, query []byte, n, workers int, timeout time.Duration, deadline time.Time) (Result, error) {
	if len(query) < 12 || workers < 1 {
		return Result{}, errors.New("dnsload: bad query or worker count")
	}
	var next, answered, lost atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	start := time.Now()
	for w := 0; w < workers; w++ {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			return Result{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			q := append([]byte(nil), query...)
			buf := make([]byte, 4096)
			for {
				i := next.Add(1)
				if i > int64(n) || time.Now().After(deadline) {
					return
				}
				id := uint16(i)
				binary.BigEndian.PutUint16(q, id)
				if _, err := conn.Write(q); err != nil {
					errc <- err
					return
				}
				conn.SetReadDeadline(time.Now().Add(timeout))
				for {
					m, err := conn.Read(buf)
					if err != nil {
						lost.Add(1)
						break
					}
					if m >= 2 && binary.BigEndian.Uint16(buf) == id {
						answered.Add(1)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	return Result{Answered: int(answered.Load()), Lost: int(lost.Load()), Elapsed: time.Since(start)}, <-errc
}
