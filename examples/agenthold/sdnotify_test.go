//go:build linux

package main

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSDNotify listens where systemd would and reads what the server
// sends when it is ready and when it stops.
func TestSDNotify(t *testing.T) {
	tag := make([]byte, 8)
	rand.Read(tag)
	for _, tc := range []struct {
		name, addr string
	}{
		{"path", filepath.Join(t.TempDir(), "notify")},
		{"abstract", "@agenthold-test-" + hex.EncodeToString(tag)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: tc.addr, Net: "unixgram"})
			require.NoError(t, err)
			defer ln.Close()
			t.Setenv(notifySocketEnv, tc.addr)
			buf := make([]byte, 256)
			for _, state := range []string{"READY=1", "STOPPING=1"} {
				require.NoError(t, sdNotify(state))
				require.NoError(t, ln.SetReadDeadline(time.Now().Add(5*time.Second)))
				n, err := ln.Read(buf)
				require.NoError(t, err)
				assert.Equal(t, state, string(buf[:n]))
			}
		})
	}
}

func TestSDNotifyWithoutSocket(t *testing.T) {
	t.Setenv(notifySocketEnv, "") // restored after the test
	os.Unsetenv(notifySocketEnv)
	assert.NoError(t, sdNotify("READY=1"), "outside systemd, notifying is a no-op")
}

func TestSDNotifyFailures(t *testing.T) {
	for _, tc := range []struct {
		name, addr string
	}{
		{"nobody listens", filepath.Join(t.TempDir(), "gone")},
		{"not a unix socket", "vsock:2:1234"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(notifySocketEnv, tc.addr)
			assert.Error(t, sdNotify("READY=1"))
		})
	}
}
