//go:build linux

package main

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/tproxy/nftrules"
)

const testVersion = "v0.0.0-test.1"

// wantImages is what each image must be, written out rather than taken
// from the builder's table.
var wantImages = map[string]struct {
	binary string
	user   string
	cmd    []string
}{
	"agenthold":      {"agenthold", "0:0", []string{"help"}},
	"egress-sidecar": {"sidecar", "1337:1337", []string{"help"}},
	"sandbox":        {"sandbox", "1000:1000", nil},
}

// TestImages builds every image twice into fresh directories for this
// machine's architecture, checks that the two layouts are byte for byte
// the same, then reads each image back: its index entry, its config, its
// filesystem, and its program run from that filesystem.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the programs")
	}
	src, err := findSource(".")
	require.NoError(t, err)
	epoch := time.Unix(1700000000, 0).UTC()
	c := config{src: src, version: testVersion, tag: "latest", platforms: []platform{{"linux", runtime.GOARCH}}, epoch: epoch}
	ctx := context.Background()

	c.out = t.TempDir()
	first, err := buildAll(ctx, c)
	require.NoError(t, err)
	again := c
	again.out = t.TempDir()
	second, err := buildAll(ctx, again)
	require.NoError(t, err)
	require.Len(t, first, len(wantImages))
	require.Len(t, second, len(wantImages))
	for i := range first {
		assert.Equal(t, first[i].ref, second[i].ref)
		assert.Equal(t, first[i].digest, second[i].digest, "%s: two builds, two digests", first[i].ref)
		t.Logf("%s %s", first[i].ref, first[i].digest)
	}
	assert.Equal(t, fileHashes(t, c.out), fileHashes(t, again.out), "two builds, two different layouts")

	for _, r := range first {
		name := filepath.Base(r.dir)
		want, ok := wantImages[name]
		require.True(t, ok, "unexpected image %s", name)
		t.Run(name, func(t *testing.T) {
			lp, err := layout.FromPath(r.dir)
			require.NoError(t, err)
			idx, err := lp.ImageIndex()
			require.NoError(t, err)
			m, err := idx.IndexManifest()
			require.NoError(t, err)
			require.Len(t, m.Manifests, 1, "index.json")
			d := m.Manifests[0]
			assert.Equal(t, types.OCIManifestSchema1, d.MediaType)
			assert.Equal(t, r.digest, d.Digest)
			assert.Equal(t, "latest", d.Annotations["org.opencontainers.image.ref.name"])
			assert.Equal(t, "ghcr.io/agenthold/"+name+":latest", d.Annotations["io.containerd.image.name"])
			assert.Equal(t, "ghcr.io/agenthold/"+name+":latest", r.ref)
			assert.Equal(t, &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, d.Platform)

			img, err := idx.Image(d.Digest)
			require.NoError(t, err)
			cf, err := img.ConfigFile()
			require.NoError(t, err)
			assert.Equal(t, "linux", cf.OS)
			assert.Equal(t, runtime.GOARCH, cf.Architecture)
			assert.True(t, cf.Created.Time.Equal(epoch), "created %v", cf.Created.Time)
			assert.Equal(t, []string{"/usr/local/bin/" + want.binary}, cf.Config.Entrypoint)
			assert.Equal(t, want.cmd, cf.Config.Cmd)
			assert.Equal(t, want.user, cf.Config.User)
			assert.Contains(t, cf.Config.Env, "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
			assert.Equal(t, name, cf.Config.Labels["org.opencontainers.image.title"])
			assert.Equal(t, testVersion, cf.Config.Labels["org.opencontainers.image.version"])
			assert.Equal(t, "https://github.com/agenthold/egress", cf.Config.Labels["org.opencontainers.image.source"])
			for _, h := range cf.History {
				assert.True(t, h.Created.Time.Equal(epoch), "history created %v", h.Created.Time)
			}

			root := extract(t, img, epoch)
			uid, _, _ := strings.Cut(want.user, ":")
			passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
			require.NoError(t, err)
			assert.Regexp(t, `(?m)^[a-z]+:x:`+uid+`:`, string(passwd), "/etc/passwd names the image's user")
			assert.Greater(t, certCount(t, filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")), 100, "the trust store")

			bin := filepath.Join(root, "usr/local/bin", want.binary)
			out, err := exec.Command(bin, "version").CombinedOutput()
			require.NoError(t, err, "%s version: %s", bin, out)
			assert.True(t, strings.HasPrefix(string(out), want.binary+" "+testVersion+" (go"), "%s version: %q", want.binary, out)

			switch name {
			case "egress-sidecar":
				checkInstallCA(t, bin, root)
			case "sandbox":
				checkSandbox(t, bin, root)
			}
		})
	}
}

// checkInstallCA runs the image's install-ca on the image's trust store:
// the bundle is those roots and the sidecar's CA.
func checkInstallCA(t *testing.T, bin, root string) {
	sidecar := httptest.NewTLSServer(http.NotFoundHandler()) // its certificate stands in for the sidecar's CA
	defer sidecar.Close()
	ca := pemOf(sidecar)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(ca) }))
	defer srv.Close()
	base := filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")
	bundle := filepath.Join(t.TempDir(), "trust", "ca-certificates.crt")
	out, err := exec.Command(bin, "install-ca", "--bundle", bundle, "--base", base, "--from", srv.URL, "--exempt-uid", "54321", "--wait", "5s").CombinedOutput()
	require.NoError(t, err, "install-ca: %s", out)
	assert.Equal(t, certCount(t, base)+1, certCount(t, bundle), "the bundle is the image's roots and the CA")
}

// checkSandbox: fetch trusts what SSL_CERT_FILE (the Pod's bundle, in
// the image's place) holds and nothing else, and the process with no
// arguments waits until SIGTERM.
func checkSandbox(t *testing.T, bin, root string) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello from upstream") }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	srv.StartTLS()
	defer srv.Close()
	trust := filepath.Join(t.TempDir(), "ca-certificates.crt")
	require.NoError(t, os.WriteFile(trust, pemOf(srv), 0o644))

	cmd := exec.Command(bin, "fetch", srv.URL)
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+trust)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "fetch: %s", stderr.String())
	assert.Equal(t, "hello from upstream", string(out))
	assert.Equal(t, "HTTP/1.1 200 OK\n", stderr.String())

	cmd = exec.Command(bin, "fetch", srv.URL)
	cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	out, err = cmd.CombinedOutput()
	assert.Error(t, err, "fetch trusted a server outside the image's roots")
	assert.Contains(t, string(out), "certificate")

	cmd = exec.Command(bin)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, line, "sandbox: up")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	assert.NoError(t, cmd.Wait(), "the sandbox stops cleanly on SIGTERM")
}

// TestManifestsNameTheImages: every container of the two manifests uses
// an image this module builds, runs its program by the name the image
// has on PATH, and runs as the image's user where the two must agree.
func TestManifestsNameTheImages(t *testing.T) {
	assert.Equal(t, nftrules.DefaultExemptUID, sidecarUID, "the sidecar image's uid is the one the rules exempt")
	byRef := map[string]image{}
	for _, im := range images {
		byRef[im.ref("latest")] = im
	}
	seen := map[string]bool{}
	for _, path := range []string{"../agenthold/deploy/daemonset.yaml", "../sidecar/deploy/pod.yaml"} {
		for _, c := range containers(t, path) {
			t.Run(filepath.Base(path)+"/"+c.Name, func(t *testing.T) {
				im, ok := byRef[c.Image]
				require.True(t, ok, "%s uses %s, which examples/images does not build", c.Name, c.Image)
				seen[im.name] = true
				if len(c.Command) > 0 {
					assert.Equal(t, im.binary, c.Command[0], "the command is not the image's program")
				}
				uid := im.uid
				if c.SecurityContext.RunAsUser != nil {
					uid = int(*c.SecurityContext.RunAsUser)
				}
				switch {
				case im.name == "agenthold":
					assert.True(t, c.SecurityContext.Privileged, "agenthold runs privileged")
				case c.Name == "egress-sidecar":
					assert.Equal(t, im.uid, uid, "serve runs as the image's user")
				case im.name == "sandbox":
					assert.Equal(t, im.uid, uid, "the sandbox runs as the image's user")
					assert.Empty(t, c.Command, "the sandbox runs the image's entrypoint")
				}
				if c.Name != "egress-sidecar" {
					assert.NotEqual(t, sidecarUID, uid, "only serve runs as the exempt uid")
				}
			})
		}
	}
	for _, im := range images {
		assert.True(t, seen[im.name], "no manifest uses %s", im.ref("latest"))
	}
}

// TestIndexOfPlatforms: with several platforms, index.json names one
// index, tagged, of one image per platform.
func TestIndexOfPlatforms(t *testing.T) {
	im := images[len(images)-1]
	ps, err := parsePlatforms("linux/amd64,linux/arm64")
	require.NoError(t, err)
	var imgs []v1.Image
	for _, p := range ps {
		img, err := im.build(p, []byte("not a program: "+p.arch), rootsPEM(), "v1", time.Unix(0, 0).UTC())
		require.NoError(t, err)
		imgs = append(imgs, img)
	}
	dir := filepath.Join(t.TempDir(), "sandbox")
	require.NoError(t, writeLayout(dir, im.index(imgs, ps, "v1.2.3")))

	lp, err := layout.FromPath(dir)
	require.NoError(t, err)
	top, err := lp.ImageIndex()
	require.NoError(t, err)
	m, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, m.Manifests, 1)
	assert.Equal(t, types.OCIImageIndex, m.Manifests[0].MediaType)
	assert.Equal(t, "v1.2.3", m.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, "ghcr.io/agenthold/sandbox:v1.2.3", m.Manifests[0].Annotations["io.containerd.image.name"])
	inner, err := top.ImageIndex(m.Manifests[0].Digest)
	require.NoError(t, err)
	im2, err := inner.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im2.Manifests, 2)
	for i, d := range im2.Manifests {
		assert.Equal(t, ps[i].arch, d.Platform.Architecture)
		img, err := inner.Image(d.Digest)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		assert.Equal(t, ps[i].arch, cf.Architecture)
	}
}

func TestWriteLayoutReplacesOnlyLayouts(t *testing.T) {
	im := images[0]
	img, err := im.build(platform{"linux", "amd64"}, []byte("stub"), nil, "v1", time.Unix(0, 0).UTC())
	require.NoError(t, err)
	idx := im.index([]v1.Image{img}, []platform{{"linux", "amd64"}}, "latest")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644))
	assert.ErrorContains(t, writeLayout(dir, idx), "not an image layout")
	assert.FileExists(t, filepath.Join(dir, "notes.txt"), "a directory that is not a layout is left alone")

	dir = filepath.Join(t.TempDir(), "agenthold")
	require.NoError(t, writeLayout(dir, idx), "a new directory")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "blobs", "sha256", "stale"), nil, 0o644))
	require.NoError(t, writeLayout(dir, idx), "a layout already there")
	assert.NoFileExists(t, filepath.Join(dir, "blobs", "sha256", "stale"), "the old layout's blobs are gone")
}

func TestParsePlatforms(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []platform
	}{
		{"linux/amd64", []platform{{"linux", "amd64"}}},
		{"linux/amd64, linux/arm64", []platform{{"linux", "amd64"}, {"linux", "arm64"}}},
		{"", nil},
		{"linux", nil},
		{"linux/", nil},
		{"darwin/arm64", nil},
		{"linux/arm/v7", nil},
		{"linux/amd64,linux/amd64", nil},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parsePlatforms(tc.in)
			if tc.want == nil {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestSourceDateEpoch(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 0, true},
		{"0", 0, true},
		{"1700000000", 1700000000, true},
		{"8589934591", 1<<33 - 1, true}, // the largest a tar header's mtime holds
		{"8589934592", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"yesterday", 0, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := sourceDateEpoch(tc.in)
			if !tc.ok {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.Unix())
		})
	}
}

func TestRootsPEM(t *testing.T) {
	var n int
	rest := rootsPEM()
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		_, err := x509.ParseCertificate(b.Bytes)
		require.NoError(t, err)
		n++
	}
	assert.Empty(t, rest)
	assert.Greater(t, n, 100)
	assert.Equal(t, rootsPEM(), rootsPEM(), "the same bundle every time")
}

func TestUsage(t *testing.T) {
	var stdout, stderr strings.Builder
	ctx := context.Background()
	assert.Equal(t, 2, run(ctx, nil, &stdout, &stderr), "no -out")
	assert.Contains(t, stderr.String(), "-out is required")
	assert.Equal(t, 2, run(ctx, []string{"-out", t.TempDir(), "-platform", "windows/amd64"}, &stdout, &stderr))
	assert.Equal(t, 2, run(ctx, []string{"-out", t.TempDir(), "extra"}, &stdout, &stderr))
	assert.Equal(t, 0, run(ctx, []string{"-h"}, &stdout, &stderr))
	assert.Contains(t, stdout.String(), "images -out DIR")
	_, err := buildAll(ctx, config{out: t.TempDir(), src: ".", version: "has space", tag: "latest", platforms: []platform{{"linux", "amd64"}}})
	assert.ErrorContains(t, err, "version")
}

// extract writes img's one layer under a new directory and returns it,
// checking that its entries are sorted, timed at epoch and owned by
// number only.
func extract(t *testing.T, img v1.Image, epoch time.Time) string {
	t.Helper()
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	root := t.TempDir()
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		assert.True(t, h.ModTime.Equal(epoch), "%s: mtime %v", h.Name, h.ModTime)
		assert.Empty(t, h.Uname+h.Gname, "%s: owned by name", h.Name)
		require.True(t, filepath.IsLocal(h.Name), "%s", h.Name)
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(p, 0o755))
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_EXCL, fs.FileMode(h.Mode).Perm())
			require.NoError(t, err)
			_, err = io.Copy(f, tr)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		default:
			t.Fatalf("%s: unexpected type %c", h.Name, h.Typeflag)
		}
	}
	assert.True(t, slices.IsSorted(names), "tar entries not sorted: %v", names)
	return root
}

// fileHashes maps each file under dir to its SHA-256.
func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	hashes := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sum := sha256.Sum256(b)
		hashes[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, hashes)
	return hashes
}

func certCount(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.Count(string(data), "-----BEGIN CERTIFICATE-----")
}

// pemOf is srv's certificate in PEM.
func pemOf(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// container is the part of a container spec the checks read.
type container struct {
	Name            string   `yaml:"name"`
	Image           string   `yaml:"image"`
	Command         []string `yaml:"command"`
	SecurityContext struct {
		RunAsUser  *int64 `yaml:"runAsUser"`
		Privileged bool   `yaml:"privileged"`
	} `yaml:"securityContext"`
}

type podSpec struct {
	InitContainers []container `yaml:"initContainers"`
	Containers     []container `yaml:"containers"`
}

// containers are every container of every Pod and Pod template in the
// YAML documents of path.
func containers(t *testing.T, path string) []container {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var all []container
	for {
		var doc struct {
			Spec struct {
				podSpec  `yaml:",inline"`
				Template struct {
					Spec podSpec `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err, "%s", path)
		}
		for _, s := range []podSpec{doc.Spec.podSpec, doc.Spec.Template.Spec} {
			all = append(all, s.InitContainers...)
			all = append(all, s.Containers...)
		}
	}
	require.NotEmpty(t, all, "%s has no containers", path)
	return all
}
