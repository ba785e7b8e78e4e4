//go:build linux

package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The fake internet's package registries: an npm registry with one small
// package, and a Python simple index with one small wheel, so that npm
// and pip do real installs through the gateway. The npm registry also
// serves a large download (npmLargePath), one long enough that the
// kernel path would take it, were it on.

// npmPackage is left-pad 1.3.0, as a tarball made at start.
var npmPackage = mustPack(npmTarball)

// demoWheel is demo-pkg 1.0, as a wheel made at start.
var demoWheel = mustPack(wheel)

const (
	npmTarballPath = "/left-pad/-/left-pad-1.3.0.tgz"
	npmLargePath   = "/large-blob/-/large-blob-1.0.0.tgz"
	npmLargeSize   = 16 << 20
	wheelName      = "demo_pkg-1.0-py3-none-any.whl"
	wheelGreeting  = "installed through agenthold"
)

func mustPack(pack func() ([]byte, error)) []byte {
	b, err := pack()
	if err != nil {
		panic(err) // archive writers into memory do not fail
	}
	return b
}

// fakeRegistry serves left-pad's metadata and tarball, and for any other
// name a stub that says which host served it.
func fakeRegistry(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == npmTarballPath {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(npmPackage)
		return
	}
	if r.URL.Path == npmLargePath {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(npmLargeSize))
		chunk := bytes.Repeat([]byte("agenthold "), 6554)[:64<<10]
		for range npmLargeSize / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		return
	}
	name := strings.TrimPrefix(r.URL.Path, "/")
	doc := map[string]any{"name": name, "dist-tags": map[string]string{"latest": "1.3.0"}, "served-by": r.Host}
	if name == "left-pad" {
		sha1sum := sha1.Sum(npmPackage)
		sha512sum := sha512.Sum512(npmPackage)
		doc["versions"] = map[string]any{"1.3.0": map[string]any{
			"name": "left-pad", "version": "1.3.0", "main": "index.js",
			"dist": map[string]string{
				"tarball":   "https://registry.npmjs.org" + npmTarballPath,
				"shasum":    hex.EncodeToString(sha1sum[:]),
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
			},
		}}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(doc)
}

// npmTarball is left-pad's package: package.json and index.js under
// package/, gzipped.
func npmTarball() ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct{ name, body string }{
		{"package/package.json", `{"name":"left-pad","version":"1.3.0","main":"index.js","license":"WTFPL"}`},
		{"package/index.js", "module.exports = (s, n, c) => String(s).padStart(n, c === undefined ? ' ' : String(c));\n"},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// fakePyPI is pypi.org's simple index (PEP 503) for demo-pkg and
// files.pythonhosted.org's wheel.
func fakePyPI(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Host == "files.pythonhosted.org" && r.URL.Path == "/packages/"+wheelName:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(demoWheel)
	case r.Host == "pypi.org" && strings.TrimSuffix(r.URL.Path, "/") == "/simple/demo-pkg":
		sum := sha256.Sum256(demoWheel)
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html>\n<html><body>\n<a href=\"https://files.pythonhosted.org/packages/%s#sha256=%x\">%s</a>\n</body></html>\n", wheelName, sum, wheelName)
	default:
		http.NotFound(w, r)
	}
}

// wheel is demo-pkg 1.0: a module and its dist-info, with a RECORD of
// their hashes (PEP 427).
func wheel() ([]byte, error) {
	files := []struct{ name, body string }{
		{"demo_pkg/__init__.py", fmt.Sprintf("GREETING = %q\n", wheelGreeting)},
		{"demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n"},
		{"demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: agenthold-demo\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("demo_pkg-1.0.dist-info/RECORD,,\n")
	files = append(files, struct{ name, body string }{"demo_pkg-1.0.dist-info/RECORD", record.String()})
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		fw, err := zw.Create(f.name)
		if err != nil {
			return nil, err
		}
		if _, err := fw.Write([]byte(f.body)); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
