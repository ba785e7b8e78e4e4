//go:build linux

package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// version is this build's release, set by the linker:
// go build -ldflags "-X main.version=v1.2.0". Empty means the module
// version the go command recorded ("(devel)" in a work tree).
var version string

func cmdVersion(args []string) error {
	if err := parseFlags(flag.NewFlagSet("version", flag.ContinueOnError), args); err != nil {
		return err
	}
	printVersion(os.Stdout)
	return nil
}

// printVersion writes "sidecar VERSION (GO OS/ARCH)".
func printVersion(w io.Writer) {
	v := version
	if bi, ok := debug.ReadBuildInfo(); v == "" && ok {
		v = bi.Main.Version
	}
	fmt.Fprintf(w, "sidecar %s (%s %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
