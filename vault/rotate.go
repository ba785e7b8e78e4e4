package vault

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// RotateKeyFile replaces the master key kept in path (LoadKeyFile's file)
// with a fresh one and re-seals every secret of v under it. A crash at any
// point leaves a vault that opens, never a mix: the new key is first
// written beside the old one (path + ".next", synced), then the vault is
// re-sealed in one atomic write, then the new key is renamed over the
// old. RecoverKeyFile, run before LoadKeyFile, finishes a rotation cut
// short between the last two steps and drops one cut short before. After
// it, the old key opens nothing.
func RotateKeyFile(v *Vault, path string) error {
	v.rotateMu.Lock()
	defer v.rotateMu.Unlock()
	next := path + ".next"
	if left, err := readKeyFile(next); err == nil && bytes.Equal(left, v.Key()) {
		// A rotation whose last rename failed: that file holds the key
		// the vault is sealed under; it goes into place first.
		if err := os.Rename(next, path); err != nil {
			return fmt.Errorf("vault: finish an earlier rotation: %w", err)
		}
		syncDir(filepath.Dir(path))
	} else if err := os.Remove(next); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("vault: a rotation's leftover key: %w", err)
	}
	key, err := NewKey()
	if err != nil {
		return err
	}
	defer clear(key)
	if err := writeKeyFile(next, key); err != nil {
		return err
	}
	syncDir(filepath.Dir(path))
	rotationStep(1)
	if err := v.Rotate(key); err != nil {
		os.Remove(next)
		return err
	}
	rotationStep(2)
	if err := os.Rename(next, path); err != nil {
		// The vault is sealed under the new key, which RecoverKeyFile
		// finds at next: the next start completes the rotation.
		return fmt.Errorf("vault: the new key stays in %s until the next start: %w", next, err)
	}
	syncDir(filepath.Dir(path))
	rotationStep(3)
	return nil
}

// RecoverKeyFile finishes or drops a rotation of the key in path that a
// crash interrupted (RotateKeyFile): if path + ".next" holds a key that
// opens st and path's key does not, it replaces path's; otherwise it is
// removed. Without such a file it does nothing.
func RecoverKeyFile(st Storage, path string) error {
	next := path + ".next"
	if _, err := os.Lstat(next); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if key, err := readKeyFile(path); err == nil && opens(st, key) {
		// Cut short before the vault was re-sealed: the new key, whole
		// or torn by the crash, is not needed.
		return os.Remove(next)
	}
	nextKey, err := readKeyFile(next)
	if err != nil {
		return err
	}
	defer clear(nextKey)
	if !opens(st, nextKey) {
		return fmt.Errorf("vault: neither %s nor %s opens %s", path, next, storageName(st))
	}
	if err := os.Rename(next, path); err != nil {
		return fmt.Errorf("vault: finish a rotation: %w", err)
	}
	syncDir(filepath.Dir(path))
	return nil
}

// opens reports whether key opens what st holds (nothing held opens with
// any key).
func opens(st Storage, key []byte) bool {
	_, err := Open(st, key, Config{})
	return err == nil
}

// syncDir makes a directory's entries (a rename) durable.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// rotationStep marks the end of each step of RotateKeyFile: the crash
// tests stop the process there.
var rotationStep = func(int) {}
