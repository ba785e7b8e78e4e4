//go:build linux

package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
)

// notifySocketEnv names the service manager's notification socket, set by
// systemd for a Type=notify unit (deploy/agenthold.service).
const notifySocketEnv = "NOTIFY_SOCKET"

// sdNotify sends state ("READY=1", "STOPPING=1") to the service manager
// as sd_notify(3) does: one datagram to the unix socket $NOTIFY_SOCKET
// names, an abstract one when the name starts with '@' (which is how the
// net package spells an abstract address too). Without the variable, as
// outside systemd, it does nothing and returns nil.
func sdNotify(state string) error {
	name := os.Getenv(notifySocketEnv)
	if name == "" {
		return nil
	}
	if name[0] != '/' && name[0] != '@' {
		return fmt.Errorf("sd_notify: %s=%q is not a unix socket", notifySocketEnv, name)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", state, err)
	}
	return nil
}

// notifySystemd is sdNotify for the server: a failure is logged, and
// never stops it (systemd then times the start out and says so).
func notifySystemd(logger *slog.Logger, state string) {
	if err := sdNotify(state); err != nil {
		logger.Warn("could not notify systemd", "state", state, "err", err)
	}
}
