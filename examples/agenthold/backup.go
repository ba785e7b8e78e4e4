//go:build linux

package main

import (
	"archive/tar"
	"bytes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/crypto/scrypt"

	"github.com/agenthold/egress/vault"
)

// A backup is the gateway's state (backupFiles, below the data
// directory) as a tar archive, sealed with XChaCha20-Poly1305: one line
// naming the format, one JSON line saying how the key is made (the master
// key, or scrypt of a passphrase and a salt), then the nonce and the
// sealed archive, which the two lines authenticate. Sealed under a
// passphrase it also holds the master key, so that it restores anywhere;
// sealed under the master key, it restores only where that key is.
const backupMagic = "agenthold-backup v1\n"

// backupFiles are the state a backup holds: agents, secrets (sealed under
// the master key), the CA, the audit key, the console's token hash and
// the next uid. Homes are sandboxes' scratch space, and the trust files
// are made again from the CA.
var backupFiles = []string{"agents.json", "secrets.json", "egress/ca.crt", "egress/ca.key", "audit.key", "ui-token.sha256", "uid.next"}

// masterKeyEntry is the master key's name in a backup sealed under a
// passphrase.
const masterKeyEntry = "master.key"

// backupHeader says how a backup's key is made.
type backupHeader struct {
	KDF  string `json:"kdf"` // "master-key" or "scrypt"
	Salt []byte `json:"salt,omitempty"`
	N    int    `json:"n,omitempty"`
	R    int    `json:"r,omitempty"`
	P    int    `json:"p,omitempty"`
}

// scrypt's cost for a passphrase: 2^15, as its paper recommends for
// interactive use (about 100 ms and 32 MiB).
const scryptN, scryptR, scryptP = 1 << 15, 8, 1

// backupKey derives the sealing key of h from the master key or the
// passphrase.
func backupKey(h backupHeader, master, passphrase []byte) ([]byte, error) {
	switch h.KDF {
	case "master-key":
		if len(master) != vault.KeySize {
			return nil, errors.New("backup: sealed under a master key, and none is here")
		}
		m := hmac.New(sha256.New, master)
		m.Write([]byte("agenthold backup v1"))
		return m.Sum(nil), nil
	case "scrypt":
		if len(passphrase) == 0 {
			return nil, errors.New("backup: sealed under a passphrase: give it (--passphrase-file)")
		}
		// Only what this version writes: the header is read before it is
		// authenticated, and a crafted one must not cost gigabytes.
		if h.N != scryptN || h.R != scryptR || h.P != scryptP || len(h.Salt) != 16 {
			return nil, fmt.Errorf("backup: scrypt parameters this version does not write (N=%d r=%d p=%d)", h.N, h.R, h.P)
		}
		return scrypt.Key(passphrase, h.Salt, h.N, h.R, h.P, chacha20poly1305.KeySize)
	}
	return nil, fmt.Errorf("backup: unknown key derivation %q", h.KDF)
}

// backupAEAD is the cipher of a backup whose header is h.
func backupAEAD(h backupHeader, master, passphrase []byte) (cipher.AEAD, error) {
	key, err := backupKey(h, master, passphrase)
	if err != nil {
		return nil, err
	}
	defer clear(key)
	return chacha20poly1305.NewX(key)
}

// makeBackup seals the state in dataDir: under the passphrase (with the
// master key inside) if there is one, or else under the master key.
func makeBackup(dataDir string, master, passphrase []byte) ([]byte, error) {
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, name := range backupFiles {
		data, err := os.ReadFile(filepath.Join(dataDir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // not made yet: no agent, no console
		}
		if err != nil {
			return nil, fmt.Errorf("backup: %w", err)
		}
		if err := add(name, data); err != nil {
			return nil, fmt.Errorf("backup: %w", err)
		}
	}
	h := backupHeader{KDF: "master-key"}
	if len(passphrase) > 0 {
		h = backupHeader{KDF: "scrypt", Salt: make([]byte, 16), N: scryptN, R: scryptR, P: scryptP}
		rand.Read(h.Salt)
		if err := add(masterKeyEntry, master); err != nil {
			return nil, fmt.Errorf("backup: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	aead, err := backupAEAD(h, master, passphrase)
	if err != nil {
		return nil, err
	}
	head, _ := json.Marshal(h)
	out := append([]byte(backupMagic), append(head, '\n')...)
	nonce := make([]byte, aead.NonceSize())
	rand.Read(nonce)
	out = append(out, nonce...)
	return aead.Seal(out, nonce, archive.Bytes(), out[:len(backupMagic)+len(head)+1]), nil
}

// openBackup authenticates and opens a backup: its files by name. Any
// change to it, a wrong key or a wrong passphrase is an error, and
// nothing is returned.
func openBackup(data, master, passphrase []byte) (map[string][]byte, error) {
	rest, ok := bytes.CutPrefix(data, []byte(backupMagic))
	if !ok {
		return nil, errors.New("backup: not an agenthold backup, or of another version")
	}
	head, sealed, ok := bytes.Cut(rest, []byte("\n"))
	if !ok {
		return nil, errors.New("backup: truncated")
	}
	var h backupHeader
	if err := json.Unmarshal(head, &h); err != nil {
		return nil, fmt.Errorf("backup: damaged header: %w", err)
	}
	aead, err := backupAEAD(h, master, passphrase)
	if err != nil {
		return nil, err
	}
	if len(sealed) < aead.NonceSize() {
		return nil, errors.New("backup: truncated")
	}
	archive, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], data[:len(data)-len(sealed)])
	if err != nil {
		if h.KDF == "scrypt" {
			return nil, errors.New("backup: the passphrase is wrong, or the file was changed")
		}
		return nil, errors.New("backup: sealed under another master key, or the file was changed")
	}
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("backup: damaged archive: %w", err)
		}
		if hdr.Name != masterKeyEntry && !slices.Contains(backupFiles, hdr.Name) {
			return nil, fmt.Errorf("backup: unexpected entry %q", hdr.Name)
		}
		if hdr.Size > 64<<20 {
			return nil, fmt.Errorf("backup: entry %q is over 64 MiB", hdr.Name)
		}
		if files[hdr.Name], err = io.ReadAll(tr); err != nil {
			return nil, fmt.Errorf("backup: damaged archive: %w", err)
		}
	}
}

// restoreBackup writes a backup's state into a data directory that holds
// none yet, and the master key it carries (a passphrase's backup) into
// keyPath; a backup sealed under the master key needs that key there
// already (or in AGENTHOLD_MASTER_KEY). The data directory is locked
// meanwhile: no server may run on it.
func restoreBackup(dataDir, keyPath string, data, passphrase []byte) error {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return err
	}
	defer lock.Close()
	for _, name := range []string{"agents.json", "secrets.json"} {
		if _, err := os.Stat(filepath.Join(dataDir, name)); err == nil {
			return fmt.Errorf("restore: %s already holds %s: restore into a data directory without state", dataDir, name)
		}
	}
	var master []byte
	if len(passphrase) == 0 {
		if master, err = vault.KeyFromEnv(masterKeyEnv); errors.Is(err, fs.ErrNotExist) {
			master, err = os.ReadFile(keyPath)
		}
		if err != nil {
			return fmt.Errorf("restore: a backup without a passphrase opens with the master key it was made under, at %s: %w", keyPath, err)
		}
	}
	files, err := openBackup(data, master, passphrase)
	if err != nil {
		return err
	}
	if key, ok := files[masterKeyEntry]; ok {
		if _, err := os.Stat(keyPath); err == nil {
			return fmt.Errorf("restore: %s exists: the backup carries its own master key; move it away first", keyPath)
		}
		if err := os.MkdirAll(filepath.Dir(keyPath), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(keyPath, key, 0o600); err != nil {
			return err
		}
		delete(files, masterKeyEntry)
	}
	for name, content := range files {
		path := filepath.Join(dataDir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		if err := writeFileAtomic(path, content, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// serveBackup answers POST /v1/backup ({"passphrase": ...} or {}) with
// a backup of the state as it is between two changes: agent changes and
// key rotations wait meanwhile, and the vault and agents files are each
// replaced whole on every change.
func (s *server) serveBackup(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Passphrase string `json:"passphrase"`
	}
	if err := decode(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	// The key and the files are read together: a rotation (which holds
	// s.mu too) cannot come between them.
	s.mu.Lock()
	master := s.vault.Key()
	data, err := makeBackup(s.cfg.DataDir, master, []byte(req.Passphrase))
	s.mu.Unlock()
	clear(master)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	s.log.Info("backup made", "under", map[bool]string{true: "a passphrase", false: "the master key"}[req.Passphrase != ""], "bytes", len(data))
	writeJSON(w, http.StatusOK, backupReply{Backup: data})
}

// backupReply is the answer to POST /v1/backup.
type backupReply struct {
	Backup []byte `json:"backup"` // base64 in JSON
}
