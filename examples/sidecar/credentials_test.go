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
