//go:build linux

package main

import (
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

// cmdVersion prints the version. It stands outside the command table, as
// help does: it needs no socket and has no flags.
func cmdVersion(args []string) error {
	if len(args) != 0 {
		return usagef("version takes no arguments")
	}
	printVersion(os.Stdout)
	return nil
}

// printVersion writes "agenthold VERSION (GO OS/ARCH)".
func printVersion(w io.Writer) {
	v := version
	if bi, ok := debug.ReadBuildInfo(); v == "" && ok {
		v = bi.Main.Version
	}
	fmt.Fprintf(w, "agenthold %s (%s %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
