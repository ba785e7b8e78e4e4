//go:build linux

// Command sidecar is the per-Pod egress filter of the seed "The egress
// filter", composed from this module's packages. It runs beside the
// sandbox in the Pod's network namespace, default deny, fail-closed at
// every step:
//
//	sidecar rules       (init container, root, NET_ADMIN) install the redirect
//	sidecar serve       (native sidecar, uid 1337, no capabilities) filter and inject
//	sidecar install-ca  (init container) write the sandbox's CA bundle
//	sidecar suggest     propose a policy file from serve's log
//
// The sandbox's TCP to port 80 goes to 15001, to 443 to 15002, anything
// else to 15003, and DNS to 15053; 15004 is the health port, never a
// redirect target. Traffic of uid 1337 (the sidecar's own) is exempt,
// which is why the sandbox must never run as that uid: install-ca refuses
// to, and the manifests in deploy/ forbid it.
//
// The policy is a file in a directory only the sidecar mounts, watched
// for changes; absent, empty, unparseable or enforce: false all deny
// everything except DNS, which answers NXDOMAIN so lookups fail fast.
// Credentials arrive resolved in a file on the sidecar's tmpfs (0600), are
// sealed in memory under a key that is never written, and the file is
// removed when the sidecar stops. The CA is minted per sandbox, in memory.
package main

import (
	"errors"
	"fmt"
	"os"
)

const usageText = `sidecar: the per-Pod egress filter.

Usage:
  sidecar rules [--exempt-uid 1337] [--dns 15053] [--http 15001] [--tls 15002] [--other 15003]
  sidecar serve --policy FILE [--credentials FILE] [--dns-upstream ADDR] [--public PREFIX]...
                [--exempt-uid 1337] [--dns 15053] [--http 15001] [--tls 15002] [--other 15003] [--health 15004]
                [--log FILE [--log-max-mb 100] [--log-files 3]] [--upstream-roots FILE] [--dns-tunnelling record|refuse]
  sidecar install-ca --bundle OUT [--base /etc/ssl/certs/ca-certificates.crt]
                [--from http://127.0.0.1:15004/ca.pem] [--exempt-uid 1337]
  sidecar suggest --log FILE [--policy CURRENT] [--collapse N]
  sidecar version

Exit codes: 0 done, 1 failed (the message says why), 2 bad usage.
`

type usageError struct{ msg string }

// errHelpShown ends a command whose --help was shown: not a failure.
var errHelpShown = errors.New("help shown")

func (e usageError) Error() string { return e.msg }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	err := dispatch(args)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "sidecar: %v\n\n%s", err, usageText)
		return 2
	}
	fmt.Fprintf(os.Stderr, "sidecar: %v\n", err)
	return 1
}

func dispatch(args []string) error {
	if len(args) == 0 {
		return usageError{"no command"}
	}
	switch args[0] {
	case "rules":
		return cmdRules(args[1:])
	case "serve":
		return cmdServe(args[1:])
	case "install-ca":
		return cmdInstallCA(args[1:])
	case "suggest":
		return cmdSuggest(args[1:])
	case "version":
		return cmdVersion(args[1:])
	case "help", "-h", "--help":
		fmt.Print(usageText)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q", args[0])}
}
