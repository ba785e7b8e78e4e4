package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// egressModule is the module whose programs the images hold.
const egressModule = "github.com/agenthold/egress"

// config is one run of the builder.
type config struct {
	out       string     // the directory the layouts go in, one per image
	src       string     // the egress module's directory
	version   string     // stamped in the programs and the images' labels
	tag       string     // the tag in the layouts' index.json
	platforms []platform // one image per platform in each layout
	epoch     time.Time  // every timestamp
	goCmd     string     // the go command; "" means "go"
}

// result is one layout written.
type result struct {
	ref    string  // registry/name:tag
	dir    string  // the layout
	digest v1.Hash // what index.json names: a manifest, or an index of them
}

var (
	versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	tagRE     = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

func (c *config) check() error {
	switch {
	case c.out == "":
		return errors.New("no output directory")
	case c.src == "":
		return errors.New("no source directory")
	case !versionRE.MatchString(c.version):
		return fmt.Errorf("version %q: want letters, digits and ._+- only", c.version)
	case !tagRE.MatchString(c.tag):
		return fmt.Errorf("tag %q is not a valid tag", c.tag)
	case len(c.platforms) == 0:
		return errors.New("no platform")
	}
	return nil
}

// buildAll builds every image for every platform and writes the layouts.
func buildAll(ctx context.Context, c config) ([]result, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	roots := rootsPEM()
	var results []result
	for _, im := range images {
		var imgs []v1.Image
		for _, p := range c.platforms {
			bin, err := c.goBuild(ctx, filepath.Join(c.src, im.module), im.pkg, p, filepath.Join(tmp, im.binary+"-"+p.arch))
			if err != nil {
				return nil, err
			}
			img, err := im.build(p, bin, roots, c.version, c.epoch)
			if err != nil {
				return nil, fmt.Errorf("%s for %s: %w", im.name, p, err)
			}
			imgs = append(imgs, img)
		}
		idx := im.index(imgs, c.platforms, c.tag)
		dir := filepath.Join(c.out, im.name)
		if err := writeLayout(dir, idx); err != nil {
			return nil, err
		}
		m, err := idx.IndexManifest()
		if err != nil {
			return nil, err
		}
		results = append(results, result{ref: im.ref(c.tag), dir: dir, digest: m.Manifests[0].Digest})
	}
	return results, nil
}

// goBuild builds pkg in the module at dir for p, static and reproducible,
// and returns the binary.
func (c *config) goBuild(ctx context.Context, dir, pkg string, p platform, out string) ([]byte, error) {
	goCmd := c.goCmd
	if goCmd == "" {
		goCmd = "go"
	}
	cmd := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X main.version="+c.version, "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = buildEnv(os.Environ(), p)
	if output, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s for %s: %w\n%s", pkg, p, err, output)
	}
	return os.ReadFile(out)
}

// buildEnv is environ without what would change a build's output behind
// its flags (GOFLAGS, GOAMD64, a go.work, ...), and with the platform.
func buildEnv(environ []string, p platform) []string {
	drop := map[string]bool{
		"GOOS": true, "GOARCH": true, "CGO_ENABLED": true, "GOFLAGS": true, "GOWORK": true,
		"GOEXPERIMENT": true, "GOAMD64": true, "GOARM64": true, "GOARM": true, "GO386": true,
		"GOPPC64": true, "GORISCV64": true, "GOMIPS": true, "GOMIPS64": true, "GOWASM": true,
	}
	var env []string
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			env = append(env, kv)
		}
	}
	return append(env, "GOOS="+p.os, "GOARCH="+p.arch, "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly")
}

// findSource is the egress module's directory: dir or the nearest
// directory above it whose go.mod declares the module.
func findSource(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if modulePath(filepath.Join(d, "go.mod")) == egressModule {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of %s in %s or above it (use -src)", egressModule, dir)
		}
	}
}

// modulePath is the module a go.mod declares, or "".
func modulePath(gomod string) string {
	f, err := os.Open(gomod)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			p := strings.TrimSpace(rest)
			if u, err := strconv.Unquote(p); err == nil {
				return u
			}
			return p
		}
	}
	return ""
}

// sourceDateEpoch parses SOURCE_DATE_EPOCH: seconds since 1970, "" for 0.
func sourceDateEpoch(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n >= 1<<33 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want a number of seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}
