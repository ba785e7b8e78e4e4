//go:build unix

package vault

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRotateKeyFileKilled: a gateway killed with SIGKILL at the end of
// each step of a rotation leaves a key file that, once RecoverKeyFile has
// run, opens every secret; never a vault that no key opens.
func TestRotateKeyFileKilled(t *testing.T) {
	if dir := os.Getenv("VAULT_ROTATE_DIR"); dir != "" {
		step, _ := strconv.Atoi(os.Getenv("VAULT_ROTATE_KILL_AT"))
		rotateUntilKilled(t, dir, step)
		return
	}
	for step := 1; step <= 3; step++ {
		t.Run("killed after step "+strconv.Itoa(step), func(t *testing.T) {
			dir := t.TempDir()
			keyPath, st, old, v := keyFileVault(t, dir)
			for _, name := range []string{"one", "two", "three"} {
				require.NoError(t, v.Set(Secret{Name: name, Rule: hostRule(name)}, []byte("sk-"+name)))
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestRotateKeyFileKilled$")
			cmd.Env = append(os.Environ(), "VAULT_ROTATE_DIR="+dir, "VAULT_ROTATE_KILL_AT="+strconv.Itoa(step))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "the rotation was not killed: %s", out)
			require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "%s", out)

			require.NoError(t, RecoverKeyFile(st, keyPath))
			key, err := LoadKeyFile(keyPath)
			require.NoError(t, err)
			for _, name := range []string{"one", "two", "three"} {
				assertSecret(t, st, key, name, "sk-"+name)
			}
			if step >= 2 {
				assert.NotEqual(t, old, key, "the vault was re-sealed: the new key")
				_, err = Open(st, old, Config{})
				assert.Error(t, err, "the old key still opens the vault")
			} else {
				assert.Equal(t, old, key, "the vault was not re-sealed: the old key")
			}
			_, err = os.Stat(keyPath + ".next")
			assert.True(t, os.IsNotExist(err), "a leftover key file after recovery")
		})
	}
}

// rotateUntilKilled is the killed gateway: it rotates the key in dir and
// kills itself at the end of step.
func rotateUntilKilled(t *testing.T, dir string, step int) {
	keyPath, _, _, v := keyFileVault(t, dir)
	rotationStep = func(s int) {
		if s == step {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // until the signal lands
		}
	}
	RotateKeyFile(v, keyPath)
	t.Fatal("the rotation ended without being killed")
}
