package vault

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Storage keeps the vault's file: its bytes are sealed and authenticated,
// so a Storage needs no secrecy of its own. Load returns fs.ErrNotExist
// when nothing was stored yet; Save replaces the content atomically.
type Storage interface {
	Load() ([]byte, error)
	Save(data []byte) error
}

// FileStorage keeps the vault in one file, replaced atomically: written
// to a temporary file beside it, synced, renamed over it, and the
// directory synced. A temporary file left by a crash is ignored and
// removed on the next Load.
type FileStorage struct {
	Path string
}

var (
	_ Storage = FileStorage{}
	_ Storage = (*MemoryStorage)(nil)
)

// MemoryStorage keeps the vault in memory only: for a vault whose key and
// values must never touch a disk (a sidecar's, filled from tmpfs).
type MemoryStorage struct {
	mu   sync.Mutex
	data []byte
}

// Load implements Storage.
func (m *MemoryStorage) Load() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.data == nil {
		return nil, fs.ErrNotExist
	}
	return bytes.Clone(m.data), nil
}

// Save implements Storage.
func (m *MemoryStorage) Save(data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.data = bytes.Clone(data)
	return nil
}

// Name is the file's path, for errors.
func (s FileStorage) Name() string { return s.Path }

// Load implements Storage.
func (s FileStorage) Load() ([]byte, error) {
	if stale, _ := filepath.Glob(s.Path + ".tmp-*"); len(stale) > 0 {
		for _, f := range stale {
			os.Remove(f)
		}
	}
	data, err := os.ReadFile(s.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("vault: read %s: %w", s.Path, err)
	}
	return data, nil
}

// Save implements Storage.
func (s FileStorage) Save(data []byte) error {
	dir := filepath.Dir(s.Path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	suffix := make([]byte, 8)
	rand.Read(suffix)
	tmp := s.Path + ".tmp-" + hex.EncodeToString(suffix)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("vault: write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, s.Path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("vault: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// The vault file is one header line, "egress-vault v2 <key id> <mac>",
// followed by the JSON document. The key id (a keyed hash of a constant)
// tells a wrong master key apart from a modified file; the MAC (HMAC-
// SHA256 under a key derived from the master key) covers the exact bytes
// of the document, so that no byte of the file can change without the
// file failing to open. Files of v1, whose header has no key id, still
// open; they are written as v2 at the next change.
const (
	fileHeaderV1 = "egress-vault v1 "
	fileHeaderV2 = "egress-vault v2 "
)

// document is the vault file's body. Values are sealed one by one, each
// bound to its record's identity and rule; the whole body is
// authenticated, so that attachments cannot be edited either.
type document struct {
	Secrets     []storedSecret   `json:"secrets"`
	Attachments []storedAttached `json:"attachments"`
}

type storedSecret struct {
	Name    string    `json:"name"`
	Owner   string    `json:"owner,omitempty"`
	Rule    Rule      `json:"rule"`
	Source  *Source   `json:"source,omitempty"`
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	Sealed  []byte    `json:"sealed"`
}

type storedAttached struct {
	Agent       string `json:"agent"`
	Secret      string `json:"secret"`
	Env         string `json:"env"`
	Placeholder string `json:"placeholder"`
}

// recordAD is the associated data a record's value is sealed with: its
// identity and its rule, so that neither can change without the value
// failing to open.
func recordAD(s *storedSecret) []byte {
	rule, _ := json.Marshal(s.Rule)
	var b strings.Builder
	b.WriteString("egress-vault/v1\x00")
	b.WriteString(s.Owner)
	b.WriteByte(0)
	b.WriteString(s.Name)
	b.WriteByte(0)
	b.Write(rule)
	if s.Source != nil { // bound too; records without one keep their old form
		source, _ := json.Marshal(s.Source)
		b.WriteString("\x00source\x00")
		b.Write(source)
	}
	return []byte(b.String())
}

func macKey(master []byte) []byte {
	m := hmac.New(sha256.New, master)
	m.Write([]byte("egress-vault/v1 file mac"))
	return m.Sum(nil)
}

// keyID names a master key without revealing it.
func keyID(master []byte) string {
	m := hmac.New(sha256.New, master)
	m.Write([]byte("egress-vault/v2 key id"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

func fileMAC(master, body []byte) string {
	m := hmac.New(sha256.New, macKey(master))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// encode serialises and authenticates a document.
func (d *document) encode(master []byte) ([]byte, error) {
	body, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("vault: encode: %w", err)
	}
	out := append([]byte(fileHeaderV2+keyID(master)+" "+fileMAC(master, body)+"\n"), body...)
	return append(out, '\n'), nil
}

// decodeDocument authenticates and parses the vault file name, then opens
// every value: any failure is an error naming the file and what failed
// (the record, where it can be told), never a partial load.
func decodeDocument(data, master []byte, name string) (*document, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("vault: %s: %w", name, fmt.Errorf(format, args...))
	}
	header, body, ok := bytes.Cut(data, []byte("\n"))
	if !ok {
		return nil, fail("not a vault file, or truncated")
	}
	var id, mac []byte
	switch {
	case bytes.HasPrefix(header, []byte(fileHeaderV2)):
		id, mac, ok = bytes.Cut(header[len(fileHeaderV2):], []byte(" "))
		if !ok {
			return nil, fail("damaged header")
		}
	case bytes.HasPrefix(header, []byte(fileHeaderV1)):
		mac = header[len(fileHeaderV1):]
	default:
		return nil, fail("not a vault file, or an unsupported version")
	}
	body, ok = bytes.CutSuffix(body, []byte("\n"))
	if !ok {
		return nil, fail("file is truncated")
	}
	if id != nil && !hmac.Equal(id, []byte(keyID(master))) {
		return nil, &RecordError{File: name, Why: fmt.Sprintf("wrong master key: the file was sealed under key id %s, this key's is %s", id, keyID(master)), Err: ErrOpen}
	}
	// Compared as the exact lower-case text, so that no spelling of the
	// same code passes either.
	if !hmac.Equal(mac, []byte(fileMAC(master, body))) {
		return nil, modification(name, body, master, id == nil)
	}
	var d document
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, fail("damaged file: %w", err)
	}
	seen := map[string]bool{}
	for i := range d.Secrets {
		s := &d.Secrets[i]
		if seen[s.Name] {
			return nil, fail("secret %q appears twice", s.Name)
		}
		seen[s.Name] = true
		pt, err := open(master, recordAD(s), s.Sealed)
		if err != nil {
			return nil, &RecordError{File: name, Record: s.Name, Why: "authentication failed (tampered, or moved from another record)", Err: err}
		}
		clear(pt)
	}
	for _, a := range d.Attachments {
		if !seen[a.Secret] {
			return nil, fail("attachment of agent %q names unknown secret %q", a.Agent, a.Secret)
		}
	}
	return &d, nil
}

// modification says what a file that fails authentication has had
// changed: the first record whose value no longer opens, or else that the
// change lies outside the sealed values. v1 files cannot tell a wrong key
// from a change to every record.
func modification(name string, body, master []byte, v1 bool) error {
	var d document
	if json.Unmarshal(body, &d) != nil {
		return &RecordError{File: name, Why: "authentication failed: the file was modified or truncated (it is not valid JSON)", Err: ErrOpen}
	}
	var failed []string
	for i := range d.Secrets {
		if pt, err := open(master, recordAD(&d.Secrets[i]), d.Secrets[i].Sealed); err == nil {
			clear(pt)
		} else {
			failed = append(failed, d.Secrets[i].Name)
		}
	}
	switch {
	case v1 && len(failed) > 0 && len(failed) == len(d.Secrets):
		return &RecordError{File: name, Why: "authentication failed: wrong master key, or every record was modified", Err: ErrOpen}
	case len(failed) > 0:
		return &RecordError{File: name, Record: failed[0], Why: "authentication failed (the file was modified)", Err: ErrOpen}
	}
	return &RecordError{File: name, Why: "authentication failed: the file was modified outside the sealed values (a rule, an attachment or the layout)", Err: ErrOpen}
}

// RecordError says which file, and which record of it when that can be
// told, failed to open, and why. It wraps ErrOpen.
type RecordError struct {
	File   string
	Record string // "" when the failure is the file's as a whole
	Why    string
	Err    error
}

func (e *RecordError) Error() string {
	if e.Record == "" {
		return fmt.Sprintf("vault: %s: %s", e.File, e.Why)
	}
	return fmt.Sprintf("vault: %s: record %q: %s", e.File, e.Record, e.Why)
}

func (e *RecordError) Unwrap() error { return e.Err }
