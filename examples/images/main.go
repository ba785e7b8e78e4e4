package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
)

const usageText = `images: build the images the Kubernetes manifests name, as OCI image layouts.

Usage:
  images -out DIR [-version dev] [-tag latest] [-platform linux/amd64,linux/arm64] [-src DIR] [-go go]

Every timestamp is SOURCE_DATE_EPOCH (seconds; 0 when unset).
Exit codes: 0 done, 1 failed, 2 bad usage.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	out := fs.String("out", "", "the directory to write the layouts in, one per image (required)")
	version := fs.String("version", "dev", "the version stamped in the programs and in the images' labels")
	tag := fs.String("tag", "latest", "the tag the layouts name")
	platforms := fs.String("platform", "linux/amd64,linux/arm64", "the platforms, comma-separated; more than one makes each layout an index")
	src := fs.String("src", "", "the egress module's directory (default: the nearest above the working directory)")
	goCmd := fs.String("go", "go", "the go command")
	usage := func(err error) int {
		fmt.Fprintf(stderr, "images: %v\n\n%s", err, usageText)
		return 2
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usageText)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return 0
	} else if err != nil {
		return usage(err)
	}
	if fs.NArg() != 0 {
		return usage(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if *out == "" {
		return usage(errors.New("-out is required"))
	}
	ps, err := parsePlatforms(*platforms)
	if err != nil {
		return usage(err)
	}
	epoch, err := sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		return usage(err)
	}
	if *src == "" {
		if *src, err = findSource("."); err != nil {
			return usage(err)
		}
	}
	results, err := buildAll(ctx, config{
		out: *out, src: *src, version: *version, tag: *tag,
		platforms: ps, epoch: epoch, goCmd: *goCmd,
	})
	if err != nil {
		fmt.Fprintf(stderr, "images: %v\n", err)
		return 1
	}
	for _, r := range results {
		fmt.Fprintf(stdout, "%s\t%s\t%s\n", r.ref, r.digest, r.dir)
	}
	return 0
}
