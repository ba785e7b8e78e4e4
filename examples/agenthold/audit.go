//go:build linux

package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/agenthold/egress/egresslog"
)

// The audit key seals the request log file (egress.log_file_audit): an
// Ed25519 key kept beside the master key, created on first use, whose
// public half anyone may hold to verify the file.

func (s *server) auditKeyPath() string { return filepath.Join(s.cfg.DataDir, "audit.key") }

// loadAuditKey reads the audit key, creating it (mode 0600) if absent.
func loadAuditKey(path string) (ed25519.PrivateKey, error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		seed = make([]byte, ed25519.SeedSize)
		rand.Read(seed)
		if err := os.WriteFile(path, seed, 0o600); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s: not an Ed25519 seed (%d bytes, want %d)", path, len(seed), ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// serveAuditKey answers with the public half of the audit key.
func (s *server) serveAuditKey(w http.ResponseWriter, _ *http.Request) {
	key, err := loadAuditKey(s.auditKeyPath())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"public_key": base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey))})
}

func cmdAuditKey(env *cliEnv, fs *flag.FlagSet, args []string) error {
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	pub, err := auditPublicKey(env)
	if err != nil {
		return err
	}
	fmt.Println(base64.StdEncoding.EncodeToString(pub))
	return nil
}

func auditPublicKey(env *cliEnv) (ed25519.PublicKey, error) {
	var out struct {
		PublicKey string `json:"public_key"`
	}
	if err := env.client().do("GET", "/v1/audit/key", nil, &out); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(out.PublicKey)
}

func cmdAuditVerify(env *cliEnv, fs *flag.FlagSet, args []string) error {
	keyText := fs.String("key", "", "the public key (base64; default: the gateway's, from agenthold audit key)")
	files, err := parse(fs, args, -1)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return usagef("audit verify: name the files, oldest first (egress.jsonl.2 egress.jsonl.1 egress.jsonl)")
	}
	var pub ed25519.PublicKey
	if *keyText != "" {
		pub, err = base64.StdEncoding.DecodeString(*keyText)
	} else {
		pub, err = auditPublicKey(env)
	}
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("audit verify: no public key (%v)", err)
	}
	v, err := egresslog.Verify(pub, files...)
	if err != nil {
		return err
	}
	for _, p := range v.Problems {
		fmt.Println("TAMPERED", p)
	}
	if n := len(v.Unsealed); n > 0 {
		first := v.Unsealed[0]
		fmt.Printf("unsealed: the last %d lines, from %s:%d, are covered by no seal yet (written after the last seal: a gateway that stopped or still writes, or added without the key)\n", n, first.File, first.Line)
	}
	if n := len(v.Unvouched); n > 0 {
		first := v.Unvouched[0]
		fmt.Printf("unvouched: %d lines, from %s:%d, came after a seal and before a restart, which could not vouch for them (written before a crash, or added without the key)\n", n, first.File, first.Line)
	}
	fmt.Printf("%d lines, %d sealed, %d problems\n", v.Lines, v.Sealed, len(v.Problems))
	if len(v.Problems) > 0 {
		return errors.New("audit verify: the files were changed")
	}
	return nil
}
