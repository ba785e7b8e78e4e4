//go:build linux

package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/vault"
)

// TestRotateMasterKey: the admin API's rotation re-seals the vault under
// a new key in the key file, which the next start opens with every
// secret, and refuses when the key came from the environment.
func TestRotateMasterKey(t *testing.T) {
	cfg := defaultConfig()
	cfg.DataDir = t.TempDir()
	s := &server{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	require.NoError(t, s.openVault())
	require.NoError(t, s.vault.Set(vault.Secret{Name: "gh", Rule: vault.Rule{Hosts: []string{"api.github.com"}, Header: "Authorization", Template: "Bearer {{.Value}}"}}, []byte("ghp_1")))
	old, err := os.ReadFile(cfg.masterKeyFile())
	require.NoError(t, err)

	rec := httptest.NewRecorder()
	s.rotateMasterKey(rec, httptest.NewRequest("POST", "/v1/master-key/rotate", nil))
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	key, err := os.ReadFile(cfg.masterKeyFile())
	require.NoError(t, err)
	assert.NotEqual(t, old, key, "the key file holds the new key")
	store := vault.FileStorage{Path: filepath.Join(cfg.DataDir, "secrets.json")}
	_, err = vault.Open(store, old, vault.Config{})
	assert.Error(t, err, "the old key still opens the vault")

	restarted := &server{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	require.NoError(t, restarted.openVault())
	assert.Len(t, restarted.vault.List(), 1, "the secrets after a restart")

	t.Setenv(masterKeyEnv, strings.Repeat("12", vault.KeySize))
	fromEnv := &server{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	fromEnv.openVault() // another key: the vault does not open, but the origin is known
	assert.True(t, fromEnv.keyFromEnv)
	rec = httptest.NewRecorder()
	fromEnv.rotateMasterKey(rec, httptest.NewRequest("POST", "/v1/master-key/rotate", nil))
	assert.Equal(t, http.StatusConflict, rec.Code, "a key from the environment was rotated")
}
