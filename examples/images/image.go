package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the images go and where they come from: the manifests name
// registry/NAME:TAG.
const (
	registry = "ghcr.io/agenthold"
	source   = "https://github.com/agenthold/egress"
	licenses = "Apache-2.0"
	binDir   = "/usr/local/bin"
	envPath  = "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Annotations of a descriptor in a layout's index.json: the tag, as OCI
// tools (skopeo's oci:DIR:TAG) look it up, and the whole reference, as
// containerd's import names the image.
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerName = "io.containerd.image.name"
)

// sidecarUID is the sidecar's uid, the one its rules exempt from the
// redirect (nftrules.DefaultExemptUID; a test checks they agree).
const sidecarUID = 1337

// sandboxUID is the sandbox's uid in the Pod: any uid but sidecarUID.
const sandboxUID = 1000

// image is one image the manifests name.
type image struct {
	name        string   // the last element of its reference, registry/NAME:TAG
	description string   // org.opencontainers.image.description
	module      string   // the module directory to build in, relative to the egress module's
	pkg         string   // the package to build, relative to module
	binary      string   // its name in binDir, the one the manifests' commands use
	uid, gid    int      // the user the image runs as unless told otherwise
	user        string   // that user's name in /etc/passwd
	home        string   // its home, made in the image when not "/"
	cmd         []string // the arguments when none are given
}

// images are the images built, in the order they are printed.
var images = []image{
	{
		name:        "agenthold",
		description: "agenthold, the egress gateway of a sandbox server (examples/agenthold); runs as root, privileged",
		module:      ".", pkg: "./examples/agenthold", binary: "agenthold",
		uid: 0, gid: 0, user: "root", home: "/",
		cmd: []string{"help"},
	},
	{
		name:        "egress-sidecar",
		description: "the per-Pod egress filter (examples/sidecar): rules, serve, install-ca",
		module:      ".", pkg: "./examples/sidecar", binary: "sidecar",
		uid: sidecarUID, gid: sidecarUID, user: "sidecar", home: "/",
		cmd: []string{"help"},
	},
	{
		name:        "sandbox",
		description: "a stand-in for the agent in the sandbox container of examples/sidecar/deploy/pod.yaml",
		module:      "examples/images", pkg: "./sandbox", binary: "sandbox",
		uid: sandboxUID, gid: sandboxUID, user: "sandbox", home: "/home/sandbox",
	},
}

// ref is the image's reference with tag.
func (im image) ref(tag string) string { return registry + "/" + im.name + ":" + tag }

// platform is an OS and architecture an image is built for.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

// parsePlatforms parses "linux/amd64,linux/arm64". The programs are
// Linux only, and variants (linux/arm/v7) are not supported.
func parsePlatforms(s string) ([]platform, error) {
	var ps []platform
	for f := range strings.SplitSeq(s, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(f), "/")
		if !ok || osName != "linux" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("platform %q: want linux/ARCH", f)
		}
		p := platform{osName, arch}
		if slices.Contains(ps, p) {
			return nil, fmt.Errorf("platform %s given twice", p)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// entry is one file or directory of an image's filesystem.
type entry struct {
	name     string // relative, no leading or trailing slash
	dir      bool
	mode     int64
	uid, gid int
	body     []byte
}

// filesystem is what image im holds besides nothing, with its program
// and trust store; parents are added as root-owned 0755 directories.
func (im image) filesystem(binary, roots []byte) []entry {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n"
	group := "root:x:0:\n"
	if im.uid != 0 {
		passwd += fmt.Sprintf("%s:x:%d:%d:%s:%s:/sbin/nologin\n", im.user, im.uid, im.gid, im.user, im.home)
		group += fmt.Sprintf("%s:x:%d:\n", im.user, im.gid)
	}
	es := []entry{
		{name: "etc/passwd", mode: 0o644, body: []byte(passwd)},
		{name: "etc/group", mode: 0o644, body: []byte(group)},
		{name: "etc/nsswitch.conf", mode: 0o644, body: []byte("hosts: files dns\n")},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: roots},
		{name: "tmp", dir: true, mode: 0o1777},
		{name: strings.TrimPrefix(binDir, "/") + "/" + im.binary, mode: 0o755, body: binary},
	}
	if im.home != "/" {
		es = append(es, entry{name: strings.TrimPrefix(im.home, "/"), dir: true, mode: 0o755, uid: im.uid, gid: im.gid})
	}
	return withParents(es)
}

// withParents adds the missing parent directories of es and sorts the
// lot by name, so that a parent comes before what it holds.
func withParents(es []entry) []entry {
	have := map[string]bool{}
	for _, e := range es {
		have[e.name] = true
	}
	for _, e := range es {
		for d := path.Dir(e.name); d != "."; d = path.Dir(d) {
			if !have[d] {
				have[d] = true
				es = append(es, entry{name: d, dir: true, mode: 0o755})
			}
		}
	}
	slices.SortFunc(es, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	return es
}

// layerTar is the uncompressed layer of es, every entry timed at epoch
// and owned by number only.
func layerTar(es []entry, epoch time.Time) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{
			Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(e.body)),
		}
		if e.dir {
			h.Name += "/"
			h.Typeflag = tar.TypeDir
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return b.Bytes(), nil
}

// gzipped compresses a layer once (the layer's digest and its blob are
// read from the same bytes), with a header that holds no name and no time.
func gzipped(raw []byte) ([]byte, error) {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return b.Bytes(), nil
}

// build assembles image im for p around binary: one layer, an OCI
// manifest and config.
func (im image) build(p platform, binary, roots []byte, version string, epoch time.Time) (v1.Image, error) {
	raw, err := layerTar(im.filesystem(binary, roots), epoch)
	if err != nil {
		return nil, err
	}
	gz, err := gzipped(raw)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(gz)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	env := []string{envPath}
	workdir := "/"
	if im.home != "/" {
		env = append(env, "HOME="+im.home)
		workdir = im.home
	}
	cfg := &v1.ConfigFile{
		Architecture: p.arch,
		OS:           p.os,
		Created:      v1.Time{Time: epoch},
		Config: v1.Config{
			Entrypoint: []string{binDir + "/" + im.binary},
			Cmd:        im.cmd,
			Env:        env,
			User:       strconv.Itoa(im.uid) + ":" + strconv.Itoa(im.gid),
			WorkingDir: workdir,
			Labels: map[string]string{
				"org.opencontainers.image.title":       im.name,
				"org.opencontainers.image.description": im.description,
				"org.opencontainers.image.source":      source,
				"org.opencontainers.image.version":     version,
				"org.opencontainers.image.licenses":    licenses,
			},
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
	built := "go build -trimpath -buildvcs=false -ldflags='-s -w -buildid= -X main.version=" + version + "' ./" + path.Join(im.module, im.pkg)
	if bi, err := buildinfo.Read(bytes.NewReader(binary)); err == nil {
		built += " (" + bi.GoVersion + ", CGO_ENABLED=0)"
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: epoch}, CreatedBy: built, Comment: "examples/images"},
	})
}

// index is what a layout's index.json names for im: its one image, or an
// index of one image per platform.
func (im image) index(imgs []v1.Image, ps []platform, tag string) v1.ImageIndex {
	ann := map[string]string{annotationRefName: tag, annotationContainerName: im.ref(tag)}
	top := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	if len(imgs) == 1 {
		return mutate.AppendManifests(top, mutate.IndexAddendum{Add: imgs[0], Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: ps[0].os, Architecture: ps[0].arch}, Annotations: ann,
		}})
	}
	var adds []mutate.IndexAddendum
	for i, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: ps[i].os, Architecture: ps[i].arch},
		}})
	}
	all := mutate.AppendManifests(top, adds...)
	return mutate.AppendManifests(top, mutate.IndexAddendum{Add: all, Descriptor: v1.Descriptor{Annotations: ann}})
}

// writeLayout writes idx as the image layout dir, replacing the layout
// already there; it refuses to replace anything else.
func writeLayout(dir string, idx v1.ImageIndex) error {
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return fmt.Errorf("refusing to replace %s: not an image layout", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if _, err := layout.Write(dir, idx); err != nil {
		return fmt.Errorf("writing %s: %w", dir, err)
	}
	return nil
}
