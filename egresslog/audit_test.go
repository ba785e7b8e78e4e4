package egresslog

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// auditedFiles writes n records through a Log to an audited file rotated
// small, and returns the key and the files, oldest first.
func auditedFiles(t *testing.T, n int) (ed25519.PublicKey, []string) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	sink, err := JSONFile{Path: path, MaxBytes: 8 << 10, Keep: 50, Seal: key}.Open()
	require.NoError(t, err)
	l := &Log{Sinks: []Sink{sink}, SinkQueue: n, DenialBurst: n}
	for i := range n {
		l.Record(Record{Agent: "a1", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Port: 443, Allowed: i%3 != 0, Reason: "r"})
	}
	require.NoError(t, l.Shutdown(t.Context()))
	var files []string
	for i := 50; i > 0; i-- {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", path, i)); err == nil {
			files = append(files, fmt.Sprintf("%s.%d", path, i))
		}
	}
	return pub, append(files, path)
}

func TestAuditedFilesVerify(t *testing.T) {
	pub, files := auditedFiles(t, 300)
	require.Greater(t, len(files), 3, "rotated")
	v, err := Verify(pub, files...)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Empty(t, v.Unsealed)
	assert.Equal(t, v.Lines, v.Sealed)
	assert.Greater(t, v.Lines, 300, "records and the files' first lines")
	// Records still read as records.
	data, err := os.ReadFile(files[len(files)-1])
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(data), "\n")
	_, err = ParseJSON([]byte(strings.SplitN(string(data), "\n", 3)[1]))
	assert.NoError(t, err, "a record line of an audited file parses as a record")
	assert.Contains(t, first, `"segment":true`)

	other, _, _ := ed25519.GenerateKey(rand.Reader)
	v, err = Verify(other, files...)
	require.NoError(t, err)
	assert.NotEmpty(t, v.Problems, "verified with another key")
}

// TestBusyAuditTrailVerifies: lines written faster than the file's
// buffer empties (more than a buffer's worth between flushes) verify: a
// seal a flush writes signs the lines before it, not the line whose
// write made the flush.
func TestBusyAuditTrailVerifies(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	sink, err := JSONFile{Path: path, Seal: key}.Open()
	require.NoError(t, err)
	for i := range 2000 {
		require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindDNS, Host: fmt.Sprintf("h%d.example", i), Allowed: true, Reason: "allowed by rule"}))
	}
	require.NoError(t, sink.Close())
	v, err := Verify(pub, path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems, "an honest trail written in a burst")
	assert.Equal(t, v.Lines, v.Sealed)
}

// TestTornLineThenRestart: a gateway restarted after a crash cut its last
// write short cuts the unfinished line, so that the records written next
// are whole lines and the trail verifies.
func TestTornLineThenRestart(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	write := func(hosts ...string) {
		sink, err := JSONFile{Path: path, Seal: key}.Open()
		require.NoError(t, err)
		for _, h := range hosts {
			require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindTLS, Host: h, Allowed: true}))
		}
		require.NoError(t, sink.Close())
	}
	write("before0.example", "before1.example")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"seq":99,"time":"2026-01-01T00:00:00Z","agent":"a1","ki`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	write("after0.example", "after1.example")

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(data), `"seq":99`, "the unfinished line was kept")
	var hosts []string
	for line := range strings.SplitSeq(strings.TrimSuffix(string(data), "\n"), "\n") {
		if r, err := ParseJSON([]byte(line)); err == nil {
			hosts = append(hosts, r.Host)
		}
	}
	assert.Equal(t, []string{"before0.example", "before1.example", "after0.example", "after1.example"}, hosts)
	v, err := Verify(pub, path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Empty(t, v.Unsealed)
}

// TestCrashBetweenRotationAndWrite: a gateway that stopped after rotating
// but before writing the new file resumes the chain from the rotated
// file, not from its start.
func TestCrashBetweenRotationAndWrite(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	sink, err := JSONFile{Path: path, Seal: key}.Open()
	require.NoError(t, err)
	for i := range 5 {
		require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindDNS, Host: fmt.Sprintf("h%d.example", i), Allowed: true}))
	}
	require.NoError(t, sink.Close())
	require.NoError(t, os.Rename(path, path+".1"))     // rotated, and the new file
	require.NoError(t, os.WriteFile(path, nil, 0o600)) // made but never written
	sink, err = JSONFile{Path: path, Seal: key}.Open()
	require.NoError(t, err)
	require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindDNS, Host: "after.example", Allowed: true}))
	require.NoError(t, sink.Close())
	v, err := Verify(pub, path+".1", path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Empty(t, v.Unsealed)
}

// TestLinesCutAtTheStart: sealed lines cut from the start of the oldest
// file are reported: a file begins with its segment line, and the line
// after it follows it.
func TestLinesCutAtTheStart(t *testing.T) {
	for _, tc := range []struct {
		keep func([]string) []string
		at   int // the line reported
	}{
		{func(lines []string) []string { return lines[len(lines)/2:] }, 1},                         // the segment line too
		{func(lines []string) []string { return append(lines[:1:1], lines[len(lines)/2:]...) }, 2}, // after the segment line
	} {
		pub, files := auditedFiles(t, 300)
		data, err := os.ReadFile(files[0])
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		require.NoError(t, os.WriteFile(files[0], []byte(strings.Join(tc.keep(lines), "\n")+"\n"), 0o600))
		v, err := Verify(pub, files...)
		require.NoError(t, err)
		require.NotEmpty(t, v.Problems, "lines cut at the start")
		assert.Equal(t, Place{files[0], tc.at}, v.Problems[0].Place)
	}
}

// TestANewKeyBeginsAFile: a trail opened with another key than the one
// that sealed it goes on in a new file, so that each file verifies with
// the key that sealed it.
func TestANewKeyBeginsAFile(t *testing.T) {
	pub1, key1, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pub2, key2, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	for _, k := range []ed25519.PrivateKey{key1, key2, key2} {
		sink, err := JSONFile{Path: path, Seal: k}.Open()
		require.NoError(t, err)
		require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindDNS, Host: "x.example", Allowed: true}))
		require.NoError(t, sink.Close())
	}
	_, err = os.Stat(path + ".2")
	require.ErrorIs(t, err, os.ErrNotExist, "the same key reopened began a file too")
	for _, tc := range []struct {
		pub  ed25519.PublicKey
		file string
	}{{pub1, path + ".1"}, {pub2, path}} {
		v, err := Verify(tc.pub, tc.file)
		require.NoError(t, err)
		assert.Empty(t, v.Problems, tc.file)
		assert.Equal(t, v.Lines, v.Sealed, tc.file)
	}
}

// TestAuditTampering: each way to change an audited file is reported at
// its place; a crash is an unsealed tail, not tampering.
func TestAuditTampering(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, files []string) (file string, line int)
		what   string // "" for no problem, only an unsealed tail
	}{
		{"a changed byte", func(t *testing.T, files []string) (string, int) {
			editLines(t, files[1], func(ls []string) []string { ls[3] = strings.Replace(ls[3], `"h`, `"x`, 1); return ls })
			return files[1], 5
		}, "does not follow the line before it"},
		{"a deleted line", func(t *testing.T, files []string) (string, int) {
			editLines(t, files[1], func(ls []string) []string { return append(ls[:3], ls[4:]...) })
			return files[1], 4
		}, "the chain jumps"},
		{"two lines swapped", func(t *testing.T, files []string) (string, int) {
			editLines(t, files[1], func(ls []string) []string { ls[3], ls[4] = ls[4], ls[3]; return ls })
			return files[1], 4
		}, "the chain jumps"},
		{"a forged line appended", func(t *testing.T, files []string) (string, int) {
			last := files[len(files)-1]
			editLines(t, last, func(ls []string) []string {
				return append(ls, `{"time":"2026-12-01T00:00:00Z","agent":"a1","kind":"tls","allowed":true}`)
			})
			return last, 0
		}, "a line without its place in the chain"},
		{"a segment cut short, its seal gone", func(t *testing.T, files []string) (string, int) {
			editLines(t, files[1], func(ls []string) []string { return ls[:len(ls)-3] })
			return files[2], 1
		}, "lines removed"},
		{"a segment replaced", func(t *testing.T, files []string) (string, int) {
			_, forger, _ := ed25519.GenerateKey(rand.Reader)
			replaceSegment(t, files[1], forger)
			return files[1], 0
		}, "a seal that does not sign the lines before it"},
		{"a record without its newline at the end of a rotated file", func(t *testing.T, files []string) (string, int) {
			f, err := os.OpenFile(files[1], os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			defer f.Close()
			_, err = f.WriteString(`{"seq":7,"time":"2026-01-01T00:00:00Z","agent":"a1","kind":"tls","host":"forged.example","port":443,"allowed":true}`)
			require.NoError(t, err)
			return files[1], 0
		}, "a line without its end in a finished file"},
		{"cut by a crash mid-write", func(t *testing.T, files []string) (string, int) {
			last := files[len(files)-1]
			data, err := os.ReadFile(last)
			require.NoError(t, err)
			lines := strings.SplitAfter(string(data), "\n")
			cut := strings.Join(lines[:len(lines)-3], "") + lines[len(lines)-3][:10] // the seal gone, a line half written
			require.NoError(t, os.WriteFile(last, []byte(cut), 0o600))
			return last, 0
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, files := auditedFiles(t, 300)
			file, line := tc.tamper(t, files)
			v, err := Verify(pub, files...)
			require.NoError(t, err)
			if tc.what == "" {
				assert.Empty(t, v.Problems, "a crash reported as tampering")
				assert.NotEmpty(t, v.Unsealed, "the unsealed tail")
				assert.Equal(t, file, v.Unsealed[0].File)
				return
			}
			require.NotEmpty(t, v.Problems, "not noticed")
			p := v.Problems[0]
			assert.Contains(t, p.What, tc.what, "%v", v.Problems)
			assert.Equal(t, file, p.File, "%v", v.Problems)
			if line > 0 {
				assert.Equal(t, line, p.Line, "%v", v.Problems)
			}
		})
	}
}

// TestAuditFileResumes: a file opened again continues its chain.
func TestAuditFileResumes(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	for round := range 3 {
		sink, err := JSONFile{Path: path, Seal: key}.Open()
		require.NoError(t, err)
		for i := range 5 {
			require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindDNS, Host: fmt.Sprintf("r%d-%d.example", round, i), Allowed: true}))
		}
		require.NoError(t, sink.Close())
	}
	v, err := Verify(pub, path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Equal(t, 16, v.Sealed, "the segment line and 15 records")
}

func editLines(t *testing.T, path string, edit func([]string) []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(edit(lines), "\n")+"\n"), 0o600))
}

// replaceSegment rewrites a file's records as someone without the key
// would: a consistent chain, sealed with another key.
func replaceSegment(t *testing.T, path string, forger ed25519.PrivateKey) {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	var l auditLine
	require.NoError(t, json.Unmarshal(lines[0], &l))
	var prev [32]byte
	_, err = hex.Decode(prev[:], []byte(l.Prev))
	require.NoError(t, err)
	c := &chain{key: forger, seq: *l.Chain - 1, prev: prev}
	var out []byte
	out = append(out, c.segment()...)
	for i := range 20 {
		out = append(out, c.link(fmt.Appendf(nil, `{"time":"2026-12-01T00:00:00Z","agent":"a1","kind":"tls","host":"forged%d.example","allowed":true}`, i))...)
	}
	out = append(out, c.seal(c.sealed)...)
	require.NoError(t, os.WriteFile(path, out, 0o600))
}

// TestAuditRotationByAge: a file whose first record is older than
// MaxAge is finished at the next record, and the next segment names it.
func TestAuditRotationByAge(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	sink, err := JSONFile{Path: path, MaxAge: time.Hour, Seal: key}.Open()
	require.NoError(t, err)
	old := &Record{Time: time.Now().Add(-2 * time.Hour), Agent: "a1", Kind: KindTLS, Host: "old.example", Allowed: true}
	require.NoError(t, sink.WriteRecord(old))
	require.NoError(t, sink.Close())

	sink, err = JSONFile{Path: path, MaxAge: time.Hour, Seal: key}.Open() // a restart: the file's age is its first record's
	require.NoError(t, err)
	require.NoError(t, sink.WriteRecord(&Record{Time: time.Now(), Agent: "a1", Kind: KindTLS, Host: "new.example", Allowed: true}))
	require.NoError(t, sink.WriteRecord(&Record{Time: time.Now(), Agent: "a1", Kind: KindTLS, Host: "newer.example", Allowed: true}))
	require.NoError(t, sink.Close())
	rotated, err := os.ReadFile(path + ".1")
	require.NoError(t, err, "not rotated by age")
	current, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(rotated), "old.example")
	assert.NotContains(t, string(rotated), "new.example")
	assert.Contains(t, string(current), "new.example")
	assert.Contains(t, string(current), "newer.example", "a young file is not rotated again")
	v, err := Verify(pub, path+".1", path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Empty(t, v.Unsealed)
}

// TestAuditKill9: a gateway killed while it writes its audited file
// leaves at most an unsealed tail, which Verify reports as such and never
// as tampering; the next run says it cannot vouch for it, and its seals
// do not.
func TestAuditKill9(t *testing.T) {
	if path := os.Getenv("EGRESSLOG_AUDIT_WRITER"); path != "" {
		writeUntilKilled(t, path)
		return
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, "egress.jsonl")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "seed"), key.Seed(), 0o600))
	for round := range 3 { // killed three times, each run continuing the file
		cmd := exec.Command(os.Args[0], "-test.run=^TestAuditKill9$")
		cmd.Env = append(os.Environ(), "EGRESSLOG_AUDIT_WRITER="+path)
		require.NoError(t, cmd.Start())
		require.Eventually(t, func() bool {
			fi, err := os.Stat(path)
			return err == nil && fi.Size() > int64(64<<10*(round+1))
		}, 20*time.Second, 5*time.Millisecond, "the writer wrote nothing")
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		cmd.Wait()
	}
	files, _ := filepath.Glob(path + ".*")
	sort.Slice(files, func(i, j int) bool {
		return len(files[i]) > len(files[j]) || (len(files[i]) == len(files[j]) && files[i] > files[j])
	})
	v, err := Verify(pub, append(files, path)...)
	require.NoError(t, err)
	assert.Empty(t, v.Problems, "a kill -9 reported as tampering")
	assert.Greater(t, v.Lines, 1000)
	torn := 0 // a line the last kill cut short is in the tail, and no chained line
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 && b[len(b)-1] != '\n' {
		torn = 1
	}
	assert.Equal(t, v.Lines+torn, v.Sealed+len(v.Unsealed)+len(v.Unvouched), "every line is sealed, unvouched or in the tail")
	for _, p := range v.Unsealed {
		assert.Equal(t, path, p.File, "an unsealed line before the last run's: a killed run's tail is left unvouched by the next")
	}
}

// writeUntilKilled is the killed gateway: it writes audited records to
// path, rotated small, as fast as it can, for at most 30 s.
func writeUntilKilled(t *testing.T, path string) {
	seed, err := os.ReadFile(filepath.Join(filepath.Dir(path), "seed"))
	require.NoError(t, err)
	sink, err := JSONFile{Path: path, MaxBytes: 256 << 10, Keep: 100, Seal: ed25519.NewKeyFromSeed(seed)}.Open()
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		require.NoError(t, sink.WriteRecord(&Record{Time: time.Now(), Agent: "a1", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Allowed: true}))
		if i%50 == 0 {
			require.NoError(t, sink.Flush())
		}
	}
}

// BenchmarkRecordToFile writes a record to a file, chained (and sealed
// once a second as the file is written out) and plain.
func BenchmarkRecordToFile(b *testing.B) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	r := &Record{Agent: "a1", Kind: KindHTTP, Host: "api.github.com", Port: 443, Method: "GET", Path: "/repos/acme/widgets", Status: 200, Allowed: true, Reason: "allowed by rule", Rule: "api.github.com"}
	for _, tc := range []struct {
		name string
		seal ed25519.PrivateKey
	}{{"chained", key}, {"plain", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			sink, err := JSONFile{Path: filepath.Join(b.TempDir(), "e.jsonl"), Seal: tc.seal, MaxBytes: 1 << 30}.Open()
			require.NoError(b, err)
			defer sink.Close()
			b.ReportAllocs()
			for b.Loop() {
				sink.WriteRecord(r)
			}
			sink.Flush()
		})
	}
}

// TestARestartVouchesForNoForgedTail: someone without the key cuts the
// last records and their seal from a file and appends records of their
// own, chained as the gateway chains (SHA-256 needs no key). The gateway
// restarted takes up the chain, but its seals never cover those lines:
// Verify lists them as lines the gateway could not vouch for, and counts
// none of them sealed.
func TestARestartVouchesForNoForgedTail(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	for _, n := range []int{10, 5} { // two runs, each sealing its lines at its end
		sink, err := JSONFile{Path: path, Seal: key}.Open()
		require.NoError(t, err)
		for i := range n {
			require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindTLS, Host: fmt.Sprintf("h%d.example", i), Allowed: true}))
		}
		require.NoError(t, sink.Close())
	}

	var sealedLines int
	editLines(t, path, func(ls []string) []string {
		ls = ls[:len(ls)-6]          // the second run's records and seal
		lastChained := ls[len(ls)-2] // before the first run's seal
		var l auditLine
		require.NoError(t, json.Unmarshal([]byte(lastChained), &l))
		require.NotNil(t, l.Chain)
		c := &chain{seq: *l.Chain, prev: sha256.Sum256([]byte(lastChained))}
		sealedLines = len(ls) // the first run's lines and its seal
		for i := range 3 {
			ls = append(ls, strings.TrimSuffix(string(c.link(fmt.Appendf(nil, `{"agent":"a1","kind":"tls","host":"forged%d.example","allowed":true}`, i))), "\n"))
		}
		return ls
	})
	sink, err := JSONFile{Path: path, Seal: key}.Open()
	require.NoError(t, err)
	require.NoError(t, sink.WriteRecord(&Record{Agent: "a1", Kind: KindTLS, Host: "after.example", Allowed: true}))
	require.NoError(t, sink.Close())

	v, err := Verify(pub, path)
	require.NoError(t, err)
	assert.Empty(t, v.Problems)
	assert.Equal(t, []Place{{path, sealedLines + 1}, {path, sealedLines + 2}, {path, sealedLines + 3}}, v.Unvouched, "the forged lines")
	assert.Equal(t, v.Lines-3, v.Sealed, "a forged line counted as sealed")
	assert.Empty(t, v.Unsealed)
}
