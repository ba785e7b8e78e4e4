//go:build linux

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestVersion(t *testing.T) {
	old := version
	version = "v9.8.7"
	t.Cleanup(func() { version = old })
	var b strings.Builder
	printVersion(&b)
	assert.True(t, strings.HasPrefix(b.String(), "sidecar v9.8.7 (go"), "with the linker's version: %q", b.String())
	assert.NoError(t, dispatch([]string{"version"}))
	assert.Equal(t, 2, run([]string{"version", "extra"}), "an argument is bad usage")
}
