//go:build linux

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestVersion(t *testing.T) {
	out := captureStdout(t, func() { assert.Equal(t, exitOK, run([]string{"version"})) })
	assert.True(t, strings.HasPrefix(out, "agenthold "), "version prints %q", out)

	old := version
	version = "v9.8.7"
	t.Cleanup(func() { version = old })
	var b strings.Builder
	printVersion(&b)
	assert.True(t, strings.HasPrefix(b.String(), "agenthold v9.8.7 (go"), "with the linker's version: %q", b.String())
	assert.Equal(t, exitUsage, run([]string{"version", "extra"}))
}
