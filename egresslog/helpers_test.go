package egresslog

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// t0 is a second's start; the tests' seconds are counted from it.
var t0 = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

// splitLines returns the lines of a file of records, requiring that it
// ends with a whole one.
func splitLines(t *testing.T, data []byte) [][]byte {
	t.Helper()
	if len(data) == 0 {
		return nil
	}
	require.Equal(t, byte('\n'), data[len(data)-1], "a file ends inside a line")
	return bytes.Split(data[:len(data)-1], []byte("\n"))
}
