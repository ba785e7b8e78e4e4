//go:build linux

package egresslog

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestAFullDiskLeavesAGapNotAForgery: an audited file on a disk that
// fills up takes part of a write, then none; once there is room again,
// the trail goes on. It must verify whole, with gap lines that count the
// records lost, rather than reading as lines removed by someone.
func TestAFullDiskLeavesAGapNotAForgery(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("requires root, to mount a small tmpfs")
	}
	dir := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=96k,mode=0700"))
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	filler := filepath.Join(dir, "filler")
	require.NoError(t, os.WriteFile(filler, make([]byte, 64<<10), 0o600))

	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(dir, "egress.jsonl")
	s, err := JSONFile{Path: path, Seal: key}.Open()
	require.NoError(t, err)
	written, failed := 0, 0
	write := func(n int) {
		for i := range n {
			r := Record{Agent: "a1", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", written), Port: 443, Allowed: true, Reason: "r"}
			written++
			if s.WriteRecord(&r) != nil {
				failed++
			}
			if i%40 == 39 && s.Flush() != nil {
				failed++
			}
		}
	}
	write(400) // some 60 KiB of lines into some 32 KiB of room
	require.Positive(t, failed, "the disk never filled")
	require.NoError(t, os.Remove(filler))
	write(100)
	require.NoError(t, s.Close())

	v, err := Verify(pub, path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems, "a full disk read as tampering")
	assert.Empty(t, v.Unsealed)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	kept := bytes.Count(data, []byte(`"agent":"a1"`))
	assert.Less(t, kept, written, "records were lost")
	assert.EqualValues(t, written-kept, readGaps(t, path), "the gap lines count the records lost")
}
