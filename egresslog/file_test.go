package egresslog

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileRec is the record numbered i, whose JSON line is lineLen bytes long
// for every i < 9000.
func fileRec(i uint64) Record {
	seq := 1000 + i
	return Record{Seq: seq, Time: t0, Agent: "a", Kind: KindTLS, Host: fmt.Sprintf("h%04d.example", seq), Port: 443, Allowed: true, Reason: "r"}
}

// lineLen is the length of a fileRec's line, newline included.
var lineLen = func() int64 {
	r := fileRec(0)
	return int64(len(r.AppendJSON(nil)) + 1)
}()

// readRecords reads a file of the sink, checking that every line parses;
// gap lines are left out (readGaps counts them).
func readRecords(t *testing.T, name string) []Record {
	t.Helper()
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	var out []Record
	for _, line := range splitLines(t, data) {
		if gap(line) > 0 {
			continue
		}
		r, err := ParseJSON(line)
		require.NoError(t, err, "%s: %q", name, line)
		out = append(out, r)
	}
	return out
}

// gap is the count of records a gap line says are missing, or 0 for
// another line.
func gap(line []byte) uint64 {
	var g struct {
		Dropped uint64 `json:"dropped"`
	}
	json.Unmarshal(line, &g)
	return g.Dropped
}

// readGaps sums the records the gap lines of files say are missing.
func readGaps(t *testing.T, names ...string) uint64 {
	t.Helper()
	var n uint64
	for _, name := range names {
		data, err := os.ReadFile(name)
		require.NoError(t, err)
		for _, line := range splitLines(t, data) {
			n += gap(line)
		}
	}
	return n
}

func writeAll(t *testing.T, s *JSONSink, from, to uint64, flushEvery int) {
	t.Helper()
	for seq := from; seq < to; seq++ {
		r := fileRec(seq)
		require.NoError(t, s.WriteRecord(&r))
		if flushEvery > 0 && int(seq)%flushEvery == 0 {
			require.NoError(t, s.Flush())
		}
	}
}

// TestJSONFileRotates writes many times what the files hold: the file is
// rotated at its size, exactly Keep rotated files remain, the oldest
// lines are the ones gone, and every line in every file is whole.
func TestJSONFileRotates(t *testing.T) {
	for _, flushEvery := range []int{0, 1, 7} { // buffered across rotations, or written one by one
		t.Run(fmt.Sprintf("flush every %d", flushEvery), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "egress.jsonl")
			maxBytes, keep := 10*lineLen+lineLen/2, 3
			s, err := JSONFile{Path: path, MaxBytes: maxBytes, Keep: keep}.Open()
			require.NoError(t, err)
			writeAll(t, s, 1, 201, flushEvery)
			require.NoError(t, s.Close())

			var seqs []uint64
			for i := keep; i >= 0; i-- {
				name := path
				if i > 0 {
					name = fmt.Sprintf("%s.%d", path, i)
				}
				fi, err := os.Stat(name)
				require.NoError(t, err)
				assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), "%s mode", name)
				rs := readRecords(t, name)
				if i > 0 {
					assert.Len(t, rs, 10, "%s: rotated at its size", name)
				}
				for _, r := range rs {
					seqs = append(seqs, r.Seq)
				}
			}
			_, err = os.Stat(path + fmt.Sprint(".", keep+1))
			assert.ErrorIs(t, err, fs.ErrNotExist, "more than Keep rotated files")
			require.Len(t, seqs, 40, "lines kept: three full files and the current one")
			for i, seq := range seqs {
				assert.Equal(t, fileRec(uint64(161+i)).Seq, seq, "lines kept are the newest, in order")
			}
			entries, err := os.ReadDir(filepath.Dir(path))
			require.NoError(t, err)
			assert.Len(t, entries, keep+1, "files in the directory")
		})
	}
}

// TestJSONFileExistingSize: a file that exists at start counts with its
// size, whether it has room for one more line, none, or is already over.
func TestJSONFileExistingSize(t *testing.T) {
	tests := []struct {
		name     string
		existing int // lines
		maxBytes int64
		rotated  bool
	}{
		{"room for one more", 4, 5 * lineLen, false},
		{"full", 5, 5 * lineLen, true},
		{"one byte short", 5, 6*lineLen - 1, true},
		{"over", 9, 5 * lineLen, true},
		{"empty", 0, 5 * lineLen, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "egress.jsonl")
			var old []byte
			for i := range tt.existing {
				r := fileRec(uint64(i + 1))
				old = append(r.AppendJSON(old), '\n')
			}
			require.NoError(t, os.WriteFile(path, old, 0o600))
			s, err := JSONFile{Path: path, MaxBytes: tt.maxBytes}.Open()
			require.NoError(t, err)
			writeAll(t, s, 100, 101, 0)
			require.NoError(t, s.Close())
			cur := readRecords(t, path)
			if !tt.rotated {
				require.Len(t, cur, tt.existing+1)
				assert.Equal(t, fileRec(100).Seq, cur[tt.existing].Seq)
				_, err := os.Stat(path + ".1")
				assert.ErrorIs(t, err, fs.ErrNotExist)
				return
			}
			require.Len(t, cur, 1, "rotated before the new line")
			assert.Equal(t, fileRec(100).Seq, cur[0].Seq)
			got, err := os.ReadFile(path + ".1")
			require.NoError(t, err)
			assert.Equal(t, old, got, "the existing file, rotated whole")
		})
	}
}

// TestJSONFileLongLine: a line longer than MaxBytes has a file to itself.
func TestJSONFileLongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	s, err := JSONFile{Path: path, MaxBytes: lineLen + lineLen/2, Keep: 2}.Open()
	require.NoError(t, err)
	writeAll(t, s, 1, 2, 0)
	long := fileRec(2)
	long.Path = "/" + string(make([]byte, 200))
	long.sanitize()
	require.NoError(t, s.WriteRecord(&long))
	writeAll(t, s, 3, 4, 0)
	require.NoError(t, s.Close())
	assert.Len(t, readRecords(t, path+".2"), 1)
	got := readRecords(t, path+".1")
	require.Len(t, got, 1)
	assert.Equal(t, fileRec(2).Seq, got[0].Seq)
	assert.Len(t, readRecords(t, path), 1)
}

// TestJSONFileDefaults: OpenJSONFile rotates with the defaults.
func TestJSONFileDefaults(t *testing.T) {
	s, err := OpenJSONFile(filepath.Join(t.TempDir(), "egress.jsonl"))
	require.NoError(t, err)
	defer s.Close()
	require.NotNil(t, s.file)
	assert.EqualValues(t, DefaultMaxFileBytes, s.file.maxBytes)
	assert.Equal(t, DefaultKeepFiles, s.file.keep)
	assert.Equal(t, 100<<20, DefaultMaxFileBytes)
}

func TestJSONFileClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	s, err := JSONFile{Path: path}.Open()
	require.NoError(t, err)
	writeAll(t, s, 1, 3, 0)
	require.NoError(t, s.Close())
	r := fileRec(3)
	assert.ErrorIs(t, s.WriteRecord(&r), fs.ErrClosed)
	assert.Len(t, readRecords(t, path), 2, "Close wrote out the buffer")
	_, err = JSONFile{Path: filepath.Join(path, "not-a-dir")}.Open()
	assert.Error(t, err)
}

// TestJSONFileRotationFails: when the rename chain fails, lines are
// dropped and counted as errors rather than growing the file past its
// bound, and gap lines say how many; once it works again, rotation
// resumes.
func TestJSONFileRotationFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "egress.jsonl")
	s, err := JSONFile{Path: path, MaxBytes: 2*lineLen + lineLen/2, Keep: 1}.Open()
	require.NoError(t, err)
	defer s.Close()
	writeAll(t, s, 1, 3, 0)
	require.NoError(t, os.Mkdir(path+".1", 0o700)) // in the way of the rename
	require.NoError(t, os.WriteFile(filepath.Join(path+".1", "x"), nil, 0o600))
	r := fileRec(3)
	assert.Error(t, s.WriteRecord(&r), "a rotation that failed")
	r = fileRec(4)
	assert.Error(t, s.WriteRecord(&r), "a rotation that failed again")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.LessOrEqual(t, fi.Size(), 2*lineLen+lineLen/2)
	require.NoError(t, os.RemoveAll(path+".1"))
	writeAll(t, s, 5, 6, 0)
	require.NoError(t, s.Flush())
	got := readRecords(t, path)
	require.Len(t, got, 1)
	assert.Equal(t, fileRec(5).Seq, got[0].Seq)
	assert.Len(t, readRecords(t, path+".1"), 2)
	assert.EqualValues(t, 2, readGaps(t, path+".1", path), "the records dropped, told in gap lines")
}

// TestJSONFileThroughLog: a Log's records reach a rotated file whole,
// however the sink goroutine's flushes fall.
func TestJSONFileThroughLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	s, err := JSONFile{Path: path, MaxBytes: 4 << 10, Keep: 2}.Open()
	require.NoError(t, err)
	l := &Log{Sinks: []Sink{s}, SinkQueue: 1000}
	for i := range 1000 {
		l.Record(Record{Agent: "a", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Port: 443, Allowed: true, Reason: "allowed by rule"})
	}
	require.NoError(t, l.Shutdown(t.Context())) // closes the file too
	var total int
	for _, name := range []string{path + ".2", path + ".1", path} {
		fi, err := os.Stat(name)
		require.NoError(t, err)
		assert.LessOrEqual(t, fi.Size(), int64(4<<10), name)
		total += len(readRecords(t, name))
	}
	assert.Positive(t, total)
}

// closingSink counts its Close calls and refuses records after one.
type closingSink struct {
	closed  atomic.Int32
	late    atomic.Int32 // records written after Close
	written atomic.Int32
}

func (c *closingSink) WriteRecord(*Record) error {
	if c.closed.Load() > 0 {
		c.late.Add(1)
	}
	c.written.Add(1)
	return nil
}
func (c *closingSink) Flush() error { return nil }
func (c *closingSink) Close() error { c.closed.Add(1); return nil }

// TestLogClosesItsSinks: the Log owns its sinks. Shutdown returns once
// they are written out and closed; Close closes them once the queue is
// written, in the background; neither closes a sink twice or writes to
// it after closing it.
func TestLogClosesItsSinks(t *testing.T) {
	for _, stop := range []struct {
		name  string
		stop  func(*Log) error
		waits bool // returns once the sinks are closed
	}{
		{"Shutdown", func(l *Log) error { return l.Shutdown(t.Context()) }, true},
		{"Close", (*Log).Close, false},
	} {
		t.Run(stop.name, func(t *testing.T) {
			sink := &closingSink{}
			l := &Log{Sinks: []Sink{sink}, SinkQueue: 100}
			for i := range 50 {
				l.Record(Record{Agent: "a", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Port: 443, Allowed: true})
			}
			require.NoError(t, stop.stop(l))
			if !stop.waits {
				require.Eventually(t, func() bool { return sink.closed.Load() > 0 }, 5*time.Second, time.Millisecond)
			}
			require.NoError(t, l.Close(), "stopping again does nothing")
			assert.EqualValues(t, 1, sink.closed.Load(), "closed once")
			assert.EqualValues(t, 50, sink.written.Load(), "every queued record written before the close")
			assert.Zero(t, sink.late.Load(), "nothing written after the close")
		})
	}
}

// TestAnOpenLogIsReadByTheGatewayAlone: a log file made before with a
// mode others may read (another tool, another umask) is made the
// gateway's alone when opened, and so are the files it is rotated into:
// a sandbox that sees the host's files reads no record.
func TestAnOpenLogIsReadByTheGatewayAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	require.NoError(t, os.Chmod(path, 0o644))
	sink, err := JSONFile{Path: path, MaxBytes: 512}.Open()
	require.NoError(t, err)
	for i := range 20 {
		require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Allowed: true}))
	}
	require.NoError(t, sink.Close())
	files, err := filepath.Glob(path + "*")
	require.NoError(t, err)
	require.Greater(t, len(files), 1, "rotated")
	for _, f := range files {
		fi, err := os.Stat(f)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), f)
	}
}
