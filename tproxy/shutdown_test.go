package tproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShutdownWithLiveClients starts and shuts down proxies while clients
// open transparent connections, CONNECT tunnels and absolute-form
// requests, so that Shutdown lands at every point of a session: both
// Serves must return ErrServerClosed, Shutdown must not outlast its
// context, and -race and the leak check must stay quiet.
func TestShutdownWithLiveClients(t *testing.T) {
	w := newWorld(t, []string{"api.test:*", "svc.test:*"}, nil)
	w.setNames("svc.test")
	w.origDst.Store(w.echoAddr)

	var ok [3]atomic.Int64 // successes per kind of client, over all cycles
	for cycle := range 40 {
		p := &Proxy{
			Agents: w.proxy.Agents, Names: w.proxy.Names, Guard: w.proxy.Guard,
			Resolver: w.proxy.Resolver, Log: w.log, OriginalDst: w.proxy.OriginalDst,
		}
		tln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		eln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		served := make(chan error, 2)
		go func() { served <- p.Serve(tln) }()
		go func() { served <- p.ServeExplicit(eln) }()

		var clients sync.WaitGroup
		progress := make(chan struct{}, 64)
		client := func(kind int, f func() error) {
			clients.Add(1)
			go func() {
				defer clients.Done()
				for range 20 {
					if f() != nil {
						return // refused or cut by the shutdown: expected
					}
					ok[kind].Add(1)
					select {
					case progress <- struct{}{}:
					default:
					}
				}
			}()
		}
		client(0, func() error { return echoThrough(tln.Addr().String()) })
		client(1, func() error {
			return connectThrough(eln.Addr().String(), fmt.Sprintf("svc.test:%d", w.echoAddr.Port()))
		})
		client(2, func() error {
			return getThrough(eln.Addr().String(), fmt.Sprintf("http://api.test:%d/", w.httpAddr.Port()))
		})

		// Land early in the first cycles, then after more and more
		// requests went through.
		for range cycle % 8 {
			select {
			case <-progress:
			case <-time.After(5 * time.Second):
				require.FailNowf(t, "no client got through", "cycle %d", cycle)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = p.Shutdown(ctx)
		cancel()
		assert.NoError(t, err, "cycle %d", cycle)
		for range 2 {
			select {
			case err := <-served:
				assert.ErrorIs(t, err, ErrServerClosed, "cycle %d", cycle)
			case <-time.After(5 * time.Second):
				require.FailNowf(t, "Serve still running after Shutdown returned", "cycle %d", cycle)
			}
		}
		clients.Wait()
	}
	for kind := range ok {
		assert.Positive(t, ok[kind].Load(), "client %d never got through: the test would prove nothing", kind)
	}
}

// echoThrough sends a line through a transparent connection to the echo
// service and reads it back.
func echoThrough(proxy string) error {
	c, err := net.DialTimeout("tcp", proxy, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		return err
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if string(b) != "echo:ping" {
		return fmt.Errorf("echo answered %q", b)
	}
	return nil
}

// connectThrough opens a CONNECT tunnel to target on the explicit proxy
// and echoes a line through it.
func connectThrough(proxy, target string) error {
	c, err := net.DialTimeout("tcp", proxy, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT answered %s", resp.Status)
	}
	if _, err := io.WriteString(c, "ping"); err != nil {
		return err
	}
	c.(*net.TCPConn).CloseWrite()
	_, err = io.ReadAll(br)
	return err
}

// getThrough sends one absolute-form request on the explicit proxy.
func getThrough(proxy, rawURL string) error {
	c, err := net.DialTimeout("tcp", proxy, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n", rawURL)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}
