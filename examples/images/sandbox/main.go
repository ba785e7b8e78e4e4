// Command sandbox is the program of the image ghcr.io/agenthold/sandbox: a
// stand-in for the agent that a real deployment runs in the sandbox
// container of examples/sidecar/deploy/pod.yaml, small enough to read,
// in an image that holds only it, a trust store and the files that name
// its user:
//
//	sandbox            wait until stopped (SIGTERM, SIGINT), so that the Pod stays up
//	sandbox fetch URL  GET URL and copy the body to stdout, the status to stderr
//	sandbox version
//
// fetch is how to see the egress filter from inside the Pod:
//
//	kubectl exec sandbox -c sandbox -- sandbox fetch https://api.anthropic.com/
//
// A destination the policy allows answers (through the sidecar's CA,
// which the Pod mounts over /etc/ssl/certs/ca-certificates.crt, when it
// is intercepted); one it denies fails to resolve or to connect. The
// image has no shell: it is the agent's own image that brings one.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"
)

// version is this build's release, set by the linker:
// go build -ldflags "-X main.version=v1.2.0".
var version string

const usageText = `sandbox: a stand-in for the agent in the sandbox container.

Usage:
  sandbox            wait until stopped (SIGTERM, SIGINT)
  sandbox fetch URL  GET URL: the body to stdout, the status to stderr
  sandbox version

Exit codes: 0 done (fetch: any HTTP status), 1 failed, 2 bad usage.
`

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	err := dispatch(args)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "sandbox: %v\n\n%s", err, usageText)
		return 2
	}
	fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
	return 1
}

func dispatch(args []string) error {
	if len(args) == 0 {
		return wait()
	}
	switch args[0] {
	case "fetch":
		if len(args) != 2 {
			return usageError{"fetch takes one URL"}
		}
		return fetch(args[1], os.Stdout, os.Stderr)
	case "version":
		if len(args) != 1 {
			return usageError{"version takes no arguments"}
		}
		v := version
		if bi, ok := debug.ReadBuildInfo(); v == "" && ok {
			v = bi.Main.Version
		}
		fmt.Printf("sandbox %s (%s %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return nil
	case "help", "-h", "--help":
		fmt.Print(usageText)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q", args[0])}
}

// wait says it is up, then blocks until SIGTERM or SIGINT.
func wait() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fmt.Println("sandbox: up; try the network with: sandbox fetch URL")
	<-ctx.Done()
	return nil
}

// fetch GETs url with the system's trust store (the Pod's bundle) and the
// proxy the environment names, if any.
func fetch(url string, body, status io.Writer) error {
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	fmt.Fprintf(status, "%s %s\n", resp.Proto, resp.Status)
	if _, err := io.Copy(body, resp.Body); err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	return nil
}
