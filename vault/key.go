package vault

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// NewKey returns a fresh random master key, for a vault that lives in
// memory only (its key is never written anywhere).
func NewKey() ([]byte, error) {
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("vault: a random key: %w", err)
	}
	return key, nil
}

// LoadKeyFile reads the master key from path, creating it on first use:
// 32 random bytes in a file of mode 0600, in a directory of mode 0700. A
// key file that group or others may read, or of the wrong size, is refused.
func LoadKeyFile(path string) ([]byte, error) {
	key, err := readKeyFile(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("vault: key directory: %w", err)
	}
	key = make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("vault: generate key: %w", err)
	}
	if err := writeKeyFile(path, key); err != nil {
		if errors.Is(err, fs.ErrExist) { // created meanwhile by another process
			return readKeyFile(path)
		}
		return nil, err
	}
	return key, nil
}

// writeKeyFile creates path, which must not exist, holding key, mode
// 0600, synced to disk.
func writeKeyFile(path string, key []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return err
		}
		return fmt.Errorf("vault: create key file: %w", err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("vault: write key file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("vault: sync key file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("vault: close key file: %w", err)
	}
	return nil
}

func readKeyFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("vault: key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("vault: key file %s has mode %v; it must be readable by its owner only (chmod 600)", path, fi.Mode().Perm())
	}
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("vault: read key file: %w", err)
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("vault: key file %s holds %d bytes, want %d", path, len(key), KeySize)
	}
	return key, nil
}

// ParseKey decodes a master key given as text, such as the value of an
// environment variable: 64 hexadecimal digits, or 32 bytes in base64
// (standard or URL alphabet, with or without padding).
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if len(s) == 2*KeySize {
		if k, err := hex.DecodeString(s); err == nil {
			return k, nil
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil {
			if len(k) != KeySize {
				return nil, fmt.Errorf("vault: key decodes to %d bytes, want %d", len(k), KeySize)
			}
			return k, nil
		}
	}
	return nil, fmt.Errorf("vault: key is neither %d hexadecimal digits nor base64 of %d bytes", 2*KeySize, KeySize)
}

// KeyFromEnv reads the master key from the environment variable name (see
// ParseKey for the encodings). An unset variable is fs.ErrNotExist.
func KeyFromEnv(name string) ([]byte, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return nil, fmt.Errorf("vault: %s is not set: %w", name, fs.ErrNotExist)
	}
	k, err := ParseKey(v)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, name)
	}
	return k, nil
}
