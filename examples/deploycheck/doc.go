// Package deploycheck decodes the example programs' Kubernetes manifests
// strictly against the real API types, so that a misspelt or misplaced
// field fails a test. It is a module of its own so that the Kubernetes
// API modules stay out of the library's go.mod.
package deploycheck
