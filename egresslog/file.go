package egresslog

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"time"
)

// Defaults for a JSONFile's zero fields.
const (
	DefaultMaxFileBytes = 100 << 20 // size at which a file of records is rotated
	DefaultKeepFiles    = 3         // rotated files kept
)

// fileBuf is how many bytes of whole lines a file sink holds before it
// writes them, besides writing when the Log's queue runs empty.
const fileBuf = 64 << 10

// JSONFile is a file of JSON lines (the form of Record.AppendJSON),
// rotated by size so that a flood of records cannot fill the disk (and by
// age, with MaxAge, at the first record past it). When a
// line would take the file past MaxBytes, Path is renamed Path.1, Path.1
// Path.2, and so on, Path.Keep being replaced (the oldest is removed), and
// a new Path is created with mode 0600. Lines are written whole, each in
// one file: none is split by a rotation. An existing Path is appended to,
// and its size counts.
//
// Disk use is bounded by (Keep+1)×MaxBytes: a line longer than MaxBytes
// (records are bounded to a few KiB) has a file to itself, and a Path
// already larger than MaxBytes when opened is rotated whole, before the
// first line. Rotated files beyond Keep left by an earlier configuration
// are left alone.
//
// Lines a write could not finish (a full disk) or a failed rotation
// dropped are counted, and the next line written is a gap line
// ({"dropped":n,"time":…}, as for GapSink). In an audit trail the chain
// goes on from the last line the file holds, so a loss reads as the gap
// it is, never as lines someone removed.
type JSONFile struct {
	Path string
	// MaxBytes is the size a file may reach before it is rotated; zero
	// means DefaultMaxFileBytes.
	MaxBytes int64
	// Keep is the number of rotated files kept, Path.1 (the newest) to
	// Path.Keep; zero means DefaultKeepFiles.
	Keep int
	// MaxAge, if set, also rotates the file once its first record is
	// older than this, so that a quiet file is finished (and, audited,
	// sealed and named by the next) within a known time.
	MaxAge time.Duration
	// Seal, if set, makes the file an audit trail: its lines are chained
	// and sealed with this key (see Verify), and a file appended to
	// continues the chain it holds; one whose seals are another key's is
	// rotated first, so that each file verifies with one key.
	Seal ed25519.PrivateKey
}

// Open opens the file, creating it with mode 0600 or appending to it, and
// returns a sink that owns it: the sink's Close closes it.
func (c JSONFile) Open() (*JSONSink, error) {
	sf := &segmentFile{path: c.Path, maxBytes: c.MaxBytes, keep: c.Keep, maxAge: c.MaxAge}
	if c.Seal != nil {
		sf.chain = &chain{key: c.Seal}
		if err := sf.chain.resume(c.Path); err != nil {
			return nil, fmt.Errorf("egresslog: resume the chain of %s: %w", c.Path, err)
		}
	}
	if sf.maxBytes <= 0 {
		sf.maxBytes = DefaultMaxFileBytes
	}
	if sf.keep <= 0 {
		sf.keep = DefaultKeepFiles
	}
	if err := sf.open(); err != nil {
		return nil, err
	}
	if sf.chain != nil && sf.chain.otherKey && sf.written > 0 {
		// Sealed by another key: the new one's lines begin a file.
		if err := sf.rotate(); err != nil {
			sf.close()
			return nil, err
		}
	}
	return &JSONSink{file: sf}, nil
}

// OpenJSONFile opens a file of JSON lines with JSONFile's defaults: it is
// rotated at DefaultMaxFileBytes, keeping DefaultKeepFiles rotated files.
// (It used to grow without bound.) The sink owns the file; Close closes
// it.
func OpenJSONFile(path string) (*JSONSink, error) {
	return JSONFile{Path: path}.Open()
}

// segmentFile writes whole lines to a file in segments: the current one
// at path, the finished ones renamed path.1 (the newest) to path.keep.
// Whether the current segment is finished is decided in one place (full)
// and a segment ends in one place (closeSegment, called by rotate), so
// that rotation by age, or a trailer that closes each segment, belongs
// there. Its caller (JSONSink) serialises calls.
type segmentFile struct {
	path     string
	maxBytes int64
	keep     int
	maxAge   time.Duration // 0: no rotation by age
	started  time.Time     // the time of f's first record

	f       *os.File // the current segment; nil after a failed rotation, until reopened
	written int64    // bytes in f
	buf     []byte   // whole lines not yet written to f
	// bufRecords are the records buf's lines stand for, and lost those
	// of lines that never reached a file (a full disk, a failed
	// rotation): the next line written is a gap line that says so.
	bufRecords, lost uint64
	closed           bool
	chain            *chain // an audited file's; nil for others
	// durable is the chain as of the last line in the file: what it
	// goes back to when buffered lines are lost, so that the next line
	// follows the last one the file holds.
	durable chain
}

// open opens (or creates) the current segment, counting what it holds,
// and cuts a line a crash left unfinished at its end.
func (s *segmentFile) open() error {
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("egresslog: open %s: %w", s.path, err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
		// A file made before (by another tool, or under another umask)
		// is the gateway's to read alone too, and so are the segments
		// it becomes.
		err = f.Chmod(0o600)
	}
	if err == nil {
		s.written, err = endWhole(f, fi.Size())
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("egresslog: open %s: %w", s.path, err)
	}
	s.f, s.started = f, time.Now()
	if s.written > 0 && s.maxAge > 0 {
		s.started = firstRecordTime(s.path, s.started)
	}
	if s.chain != nil {
		if s.written == 0 {
			s.chain.inFile = false
		}
		s.durable = *s.chain
		s.beginChain()
	}
	return nil
}

// beginChain starts the current file's part of the chain, unless it has
// begun: a new file (or one not audited before, or one whose first lines
// were lost) begins with a segment line, chained to the last line of the
// file before.
func (s *segmentFile) beginChain() {
	if !s.chain.inFile {
		s.buf = append(s.buf, s.chain.segment()...)
		s.chain.inFile = true
	}
	s.buf = append(s.buf, s.chain.resumeLine()...)
}

// endWhole cuts the file f, of size bytes, back to the end of its last
// whole line, if a write cut short by a crash left part of one after it:
// a line appended to that part would be lost with it. It returns the
// size left.
func endWhole(f *os.File, size int64) (int64, error) {
	var buf [4096]byte
	for end := size; end > 0; {
		n := min(end, int64(len(buf)))
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return size, err
		}
		if end == size && buf[n-1] == '\n' {
			return size, nil
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			cut := end - n + int64(i) + 1
			return cut, f.Truncate(cut)
		}
		end -= n
	}
	return 0, f.Truncate(0)
}

// writeLine adds one line, which ends in a newline and stands for
// records records, to the current segment, rotating first if it would not
// fit. Records lost before it are told first, in a gap line.
func (s *segmentFile) writeLine(line []byte, records uint64) error {
	if s.lost == 0 {
		return s.addLine(line, records)
	}
	lost := s.lost
	s.lost = 0
	err := s.addLine(appendGapLine(nil, lost), lost)
	return errors.Join(err, s.addLine(line, records))
}

// addLine is writeLine without the gap line.
func (s *segmentFile) addLine(line []byte, records uint64) error {
	if s.closed {
		return fmt.Errorf("egresslog: write %s: %w", s.path, fs.ErrClosed)
	}
	if s.f == nil {
		if err := s.open(); err != nil {
			return err
		}
	}
	var err error
	if s.full(len(line) + chainOverhead(s.chain)) {
		if err = s.rotate(); s.f == nil {
			s.lost += records // the line is dropped: the files stay bounded
			return err
		}
	}
	// Flushed before the line is linked: a flush may seal the chain, and
	// a seal signs the lines before it, not one still to be written.
	if len(s.buf)+len(line)+chainOverhead(s.chain) > fileBuf {
		if ferr := s.flush(); ferr != nil {
			s.lost += records
			return errors.Join(err, ferr)
		}
	}
	if s.chain != nil {
		s.beginChain()
		line = s.chain.link(line[:len(line)-1])
	}
	s.buf = append(s.buf, line...)
	s.bufRecords += records
	return err
}

// full reports whether the current segment is finished before a line of
// n bytes: it holds lines, and the line would take it past maxBytes.
func (s *segmentFile) full(n int) bool {
	size := s.written + int64(len(s.buf))
	return size > 0 && (size+int64(n) > s.maxBytes || (s.maxAge > 0 && time.Since(s.started) >= s.maxAge))
}

// firstRecordTime is the time of the first record in the file at path
// (its first lines, within 64 KiB), or otherwise.
func firstRecordTime(path string, otherwise time.Time) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return otherwise
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		var line struct {
			Time string `json:"time"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Time == "" {
			continue // a segment line, or one cut by a crash
		}
		if t, err := time.Parse(time.RFC3339Nano, line.Time); err == nil {
			return t
		}
	}
	return otherwise
}

// flush writes the buffered lines. If the file takes only some of their
// bytes, it is cut back to its last whole line and the lines are dropped,
// so that no line is ever split; the chain goes back to the file's last
// line, and the next line written says how many records were lost.
func (s *segmentFile) flush() error {
	if s.f != nil && s.chain != nil && s.chain.unsealed && time.Since(s.chain.sealed) >= DefaultSealEvery {
		s.buf = append(s.buf, s.chain.seal(time.Now())...)
	}
	if len(s.buf) == 0 || s.f == nil {
		return nil
	}
	n, err := s.f.Write(s.buf)
	records := s.bufRecords
	s.buf, s.bufRecords = s.buf[:0], 0
	if err == nil {
		s.written += int64(n)
		if s.chain != nil {
			s.durable = *s.chain
		}
		return nil
	}
	s.lost += records
	if s.chain != nil {
		*s.chain = s.durable
	}
	err = fmt.Errorf("egresslog: write %s: %w", s.path, err)
	if n > 0 {
		if terr := s.f.Truncate(s.written); terr != nil {
			// A part of a line stays: end the segment with it.
			s.written = s.maxBytes
			err = errors.Join(err, fmt.Errorf("egresslog: truncate %s: %w", s.path, terr))
		}
	}
	return err
}

// closeSegment writes out and closes the current segment.
func (s *segmentFile) closeSegment() error {
	if s.f == nil {
		return nil
	}
	if s.chain != nil && s.chain.unsealed {
		s.buf = append(s.buf, s.chain.seal(time.Now())...) // every file ends sealed
	}
	err := s.flush()
	if cerr := s.f.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("egresslog: close %s: %w", s.path, cerr))
	}
	s.f = nil
	return err
}

// rotate ends the current segment and starts the next: path.keep-1
// replaces path.keep, …, path becomes path.1, and a new path is created.
func (s *segmentFile) rotate() error {
	err := s.closeSegment()
	for i := s.keep; i > 0; i-- {
		if rerr := os.Rename(s.name(i-1), s.name(i)); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return errors.Join(err, fmt.Errorf("egresslog: rotate %s: %w", s.path, rerr))
		}
	}
	return errors.Join(err, s.open())
}

// chainOverhead is what chaining adds to a line: its place and the hash
// before it.
func chainOverhead(c *chain) int {
	if c == nil {
		return 0
	}
	return len(`,"chain":,"prev":""`) + 20 + 64
}

// name is the path of the i-th rotated file; 0 is the current one.
func (s *segmentFile) name(i int) string {
	if i == 0 {
		return s.path
	}
	return s.path + "." + strconv.Itoa(i)
}

// close writes out and closes the file; later writes fail.
func (s *segmentFile) close() error {
	s.closed = true
	return s.closeSegment()
}
