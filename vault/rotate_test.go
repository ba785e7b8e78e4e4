package vault

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRotateKeyFile: after a rotation the secrets open under the key
// file's new key, the old key opens nothing, and no leftover remains.
func TestRotateKeyFile(t *testing.T) {
	dir := t.TempDir()
	keyPath, st, old, v := keyFileVault(t, dir)
	require.NoError(t, v.Set(Secret{Name: "one", Rule: hostRule("one")}, []byte("sk-1")))
	require.NoError(t, RotateKeyFile(v, keyPath))
	_, err := Open(st, old, Config{})
	assert.Error(t, err, "the old key still opens the vault")
	key, err := LoadKeyFile(keyPath)
	require.NoError(t, err)
	assert.NotEqual(t, old, key)
	assertSecret(t, st, key, "one", "sk-1")
	require.NoError(t, v.Set(Secret{Name: "two", Rule: hostRule("two")}, []byte("sk-2")), "the open vault goes on under the new key")
	assertSecret(t, st, key, "two", "sk-2")
	_, err = os.Stat(keyPath + ".next")
	assert.True(t, os.IsNotExist(err), "a leftover key file")
}

// keyFileVault opens a vault in dir whose master key is in a key file
// there, and returns the key file's path, the storage, the key and the
// vault.
func keyFileVault(t testing.TB, dir string) (string, FileStorage, []byte, *Vault) {
	keyPath, st := filepath.Join(dir, "master.key"), FileStorage{Path: filepath.Join(dir, "secrets.json")}
	key, err := LoadKeyFile(keyPath)
	require.NoError(t, err)
	v, err := Open(st, key, Config{})
	require.NoError(t, err)
	return keyPath, st, key, v
}

// assertSecret checks that key opens st and that name holds value.
func assertSecret(t *testing.T, st Storage, key []byte, name, value string) {
	t.Helper()
	v, err := Open(st, key, Config{})
	require.NoError(t, err)
	a, err := v.Attach("checker", name, "KEY")
	require.NoError(t, err)
	req := newRequest(t, "https://"+name+".example/", nil)
	req.Header.Set("Authorization", "Bearer "+a.Placeholder)
	_, err = v.Inject("checker", req)
	require.NoError(t, err)
	assert.Equal(t, "Bearer "+value, req.Header.Get("Authorization"), name)
}

// hostRule injects a secret as a bearer token for its own host.
func hostRule(name string) Rule {
	return Rule{Hosts: []string{name + ".example"}, Header: "Authorization", Template: "Bearer {{.Value}}"}
}

// TestRecoverTornNextKey: a crash while the new key was being written
// leaves a torn key file beside a key that still opens the vault: the
// next start drops it and opens.
func TestRecoverTornNextKey(t *testing.T) {
	dir := t.TempDir()
	keyPath, st, key, v := keyFileVault(t, dir)
	require.NoError(t, v.Set(Secret{Name: "one", Rule: hostRule("one")}, []byte("sk-one")))
	require.NoError(t, os.WriteFile(keyPath+".next", nil, 0o600))
	require.NoError(t, RecoverKeyFile(st, keyPath))
	assertSecret(t, st, key, "one", "sk-one")
	_, err := os.Stat(keyPath + ".next")
	assert.True(t, os.IsNotExist(err))
}

// TestRotateFinishesAnEarlierRotation: a leftover key file that holds
// the key the vault is sealed under (an earlier rotation's rename
// failed) is put in place, never deleted, before the next rotation.
func TestRotateFinishesAnEarlierRotation(t *testing.T) {
	dir := t.TempDir()
	keyPath, st, _, v := keyFileVault(t, dir)
	require.NoError(t, v.Set(Secret{Name: "one", Rule: hostRule("one")}, []byte("sk-one")))
	sealedUnder, _ := NewKey()
	require.NoError(t, v.Rotate(sealedUnder))
	require.NoError(t, writeKeyFile(keyPath+".next", sealedUnder)) // the rename that failed
	rotationStep = func(step int) {
		if step == 1 {
			k, err := readKeyFile(keyPath)
			require.NoError(t, err)
			assert.Equal(t, sealedUnder, k, "the earlier rotation's key was not put in place first")
		}
	}
	t.Cleanup(func() { rotationStep = func(int) {} })
	require.NoError(t, RotateKeyFile(v, keyPath))
	key, err := LoadKeyFile(keyPath)
	require.NoError(t, err)
	assertSecret(t, st, key, "one", "sk-one")
}
