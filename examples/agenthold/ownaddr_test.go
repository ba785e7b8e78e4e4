//go:build linux

package main

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGatewayAddressGainedLaterIsNeverDialled: an address the gateway's
// host gains while agenthold runs (an operator's ip addr add, a DHCP
// lease) is the gateway's own, never dialled, even for an agent whose
// policy names it: a service the host offers there only to itself is not
// reached from a sandbox.
func TestGatewayAddressGainedLaterIsNeverDialled(t *testing.T) {
	w := requireWorld(t)
	const local = "198.18.41.1"
	require.NoError(t, w.gw.IP("addr", "add", local+"/32", "dev", "lo"))
	t.Cleanup(func() { w.gw.IP("addr", "del", local+"/32", "dev", "lo") })
	var ln net.Listener
	require.NoError(t, w.gw.Do(func() (err error) { ln, err = net.Listen("tcp", local+":80"); return err }))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 22\r\nConnection: close\r\n\r\nthe host's own service")
			c.Close()
		}
	}()
	require.NoError(t, w.cli(io.Discard, "policy", "set", "bob", "--allow", local))
	time.Sleep(300 * time.Millisecond) // the kernel's announcement read, well within this

	got, err := w.inSandbox("bob", "curl -sS --max-time 5 http://"+local+"/ || echo refused")
	require.NoError(t, err, got)
	assert.NotContains(t, got, "the host's own service", "a sandbox reached a service on an address the gateway gained while it ran")
	assert.Contains(t, got, "refused")
	var log strings.Builder
	require.NoError(t, w.cli(&log, "log", "--agent", "bob", "--limit", "0"))
	assert.Contains(t, log.String(), "the gateway's own address, "+local)
}
