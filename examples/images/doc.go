// Command images builds the container images that the Kubernetes
// manifests in examples/agenthold/deploy and examples/sidecar/deploy name,
// offline and reproducibly, as OCI image layouts:
//
//	cd examples/images && go run . -out /tmp/agenthold-images [-version v1.2.0] [-platform linux/amd64,linux/arm64]
//
// writes /tmp/agenthold-images/agenthold, .../egress-sidecar and
// .../sandbox, each a layout whose index.json names the image
// ghcr.io/agenthold/NAME:latest (org.opencontainers.image.ref.name
// "latest", io.containerd.image.name the whole reference). With one
// platform it points at the image's manifest, with several at an index
// of one manifest per platform.
//
// Each image is a single layer on nothing, so no base image is pulled:
//
//   - the program in /usr/local/bin, static (CGO_ENABLED=0), built with
//     -trimpath and without VCS stamps, its version set by -ldflags
//     (-X main.version) and shown by its version command;
//   - /etc/ssl/certs/ca-certificates.crt, Mozilla's roots as
//     golang.org/x/crypto/x509roots/fallback carries them (the version in
//     go.sum), without the roots NSS only trusts up to a date, which a PEM
//     file cannot say;
//   - /etc/passwd, /etc/group and /etc/nsswitch.conf naming root and the
//     image's user, and /tmp.
//
// The images, their programs and users:
//
//	agenthold       examples/agenthold       uid 0     its DaemonSet runs it privileged (namespaces, nftables)
//	egress-sidecar  examples/sidecar         uid 1337  serve's, the uid the rules exempt; the init
//	                                                   containers set their own (rules 0, install-ca 1000)
//	sandbox         examples/images/sandbox  uid 1000  a stand-in for the agent: it waits, and fetches on demand
//
// Every timestamp (files, config, history) is SOURCE_DATE_EPOCH, or 0
// when it is unset; tar entries are sorted and owned by number; layers are
// gzipped by the standard library. The same source, version, epoch and Go
// toolchain give the same digests, which the tests check.
//
// It does not push, sign or attach SBOMs: push a layout with a tool that
// reads them (skopeo copy --all oci:DIR/agenthold:latest
// docker://ghcr.io/agenthold/agenthold:latest, or crane push). It is a
// module of its own so that go-containerregistry stays out of the
// library's go.mod.
package main
