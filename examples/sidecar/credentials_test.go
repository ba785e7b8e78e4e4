//go:build linux

package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCredentialKinds: the credentials file takes AWS keys (re-signed),
// and inject entries that replace their placeholder in paths only.
func TestCredentialKinds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "credentials.yaml")
	file := `- hosts: ["*.amazonaws.com"]
  mode: aws-sigv4
  value: AKIAREALKEY0000000001:real/secret
  placeholder: sbx-placeholder-aws
- hosts: [api.telegram.org]
  replaceIn: [path]
  value: "12345:REAL-bot-token"
  placeholder: sbx-placeholder-bot
`
	require.NoError(t, os.WriteFile(path, []byte(file), 0o600))
	v, n, err := loadCredentials(path)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	r, _ := http.NewRequest("GET", "https://s3.amazonaws.com/bucket/key", nil)
	r.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
	fake := aws.Credentials{AccessKeyID: "sbx-placeholder-aws", SecretAccessKey: "sbx-placeholder-aws"}
	require.NoError(t, v4.NewSigner().SignHTTP(context.Background(), fake, r, "UNSIGNED-PAYLOAD", "s3", "us-east-1", time.Now()))
	_, err = v.Inject(sandboxAgent, r)
	require.NoError(t, err)
	assert.Contains(t, r.Header.Get("Authorization"), "Credential=AKIAREALKEY0000000001/", "not re-signed with the real key")

	bot, _ := http.NewRequest("GET", "https://api.telegram.org/botsbx-placeholder-bot/getMe", nil)
	_, err = v.Inject(sandboxAgent, bot)
	require.NoError(t, err)
	assert.Equal(t, "/bot12345:REAL-bot-token/getMe", bot.URL.Path)
	assert.Empty(t, bot.Header, "a path-only entry set a header")
}

// TestCredentialSources: an entry's value may come from a file the
// sidecar reads (again when it changes) or a command it runs, never from
// the credentials file; one with both a value and a source is refused.
func TestCredentialSources(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("tok-from-file\n"), 0o600))
	path := filepath.Join(dir, "credentials.yaml")
	file := `- hosts: [api.example.com]
  header: Authorization
  valueFile: ` + token + `
  placeholder: sbx-placeholder-file
- hosts: [cmd.example.com]
  header: Authorization
  valueCommand: [/bin/echo, tok-from-command]
  refresh: 30m
  maxStale: 1h
  placeholder: sbx-placeholder-cmd
`
	require.NoError(t, os.WriteFile(path, []byte(file), 0o600))
	v, n, err := loadCredentials(path)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	for host, want := range map[string]string{"api.example.com": "tok-from-file", "cmd.example.com": "tok-from-command"} {
		r, _ := http.NewRequest("GET", "https://"+host+"/", nil)
		_, err := v.Inject(sandboxAgent, r)
		require.NoError(t, err, host)
		assert.Equal(t, want, r.Header.Get("Authorization"), host)
	}

	both := "- hosts: [api.example.com]\n  header: Authorization\n  value: x\n  valueFile: " + token + "\n"
	require.NoError(t, os.WriteFile(path, []byte(both), 0o600))
	_, _, err = loadCredentials(path)
	assert.ErrorContains(t, err, "one of them")
}
