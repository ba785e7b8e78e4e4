package vault

import (
	"crypto/rand"
	"errors"
	"fmt"

	"golang.org/x/crypto/chacha20poly1305"
)

// KeySize is the size of the master key.
const KeySize = chacha20poly1305.KeySize

// ErrOpen is the error of a sealed value that does not open: the wrong
// key, a tampered ciphertext, or a ciphertext moved from another record.
var ErrOpen = errors.New("vault: record does not open (wrong key, tampered, or moved from another record)")

// seal encrypts plaintext with XChaCha20-Poly1305 under key, with a fresh
// random 24-byte nonce, bound to ad. The result is nonce || ciphertext.
func seal(key, ad, plaintext []byte) ([]byte, error) {
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	out := make([]byte, chacha20poly1305.NonceSizeX, chacha20poly1305.NonceSizeX+len(plaintext)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, fmt.Errorf("vault: nonce: %w", err)
	}
	return aead.Seal(out, out, plaintext, ad), nil
}

// open reverses seal.
func open(key, ad, sealed []byte) ([]byte, error) {
	aead, err := chacha20poly1305.NewX(key)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	if len(sealed) < chacha20poly1305.NonceSizeX+aead.Overhead() {
		return nil, ErrOpen
	}
	nonce, ct := sealed[:chacha20poly1305.NonceSizeX], sealed[chacha20poly1305.NonceSizeX:]
	pt, err := aead.Open(nil, nonce, ct, ad)
	if err != nil {
		return nil, ErrOpen
	}
	return pt, nil
}
