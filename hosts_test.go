package egress_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/vault"
)

// TestPolicyAndVaultAgreeOnHosts keeps the host patterns of injection
// rules and of policy entries one language: a secret's rule matches
// exactly the hosts a policy entry of the same pattern allows.
func TestPolicyAndVaultAgreeOnHosts(t *testing.T) {
	patterns := []string{"api.example.com", "*.example.com", "bücher.example", "_svc.example.net"}
	hosts := []string{
		"api.example.com", "API.Example.COM.", "example.com", "a.b.example.com", "api.example.com.evil.net",
		"xn--bcher-kva.example", "BÜCHER.example", "_svc.example.net", "svc.example.net", "apiexample.com",
	}
	v, err := vault.Open(vault.FileStorage{Path: filepath.Join(t.TempDir(), "v")}, bytes.Repeat([]byte{7}, vault.KeySize), vault.Config{})
	require.NoError(t, err)
	for _, pattern := range patterns {
		p, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{pattern + ":*"}})
		require.NoError(t, err)
		require.NoError(t, v.Set(vault.Secret{Name: "s", Rule: vault.Rule{Hosts: []string{pattern}, Header: "X-Key"}}, []byte("value")))
		_, err = v.Attach("a", "s", "S")
		require.NoError(t, err)
		for _, host := range hosts {
			req := &http.Request{URL: &url.URL{Scheme: "https", Host: host, Path: "/"}, Host: host, Header: http.Header{}}
			used, err := v.Inject("a", req)
			require.NoError(t, err)
			allowed, injected := p.Decide(host, 443).Allowed, len(used) == 1
			assert.Equal(t, allowed, injected, "pattern %q, host %q: policy allows=%v (expected), vault injects=%v (actual)", pattern, host, allowed, injected)
		}
	}
}

// TestNamesCanonicalAtTheDoor keeps name handling in one place: the
// building blocks put a name in canonical form with internal/hostname
// when it enters, and compare canonical names exactly after; nowhere else
// do they fold a name's case by hand. A case-insensitive comparison of
// something that is not a name says so on its line ("// not a name").
func TestNamesCanonicalAtTheDoor(t *testing.T) {
	folding := regexp.MustCompile(`strings\.(ToLower|EqualFold)\(`)
	var found []string
	for _, dir := range []string{"netguard", "policy", "egresslog", "dnsfilter", "tproxy", "mitm", "vault", "internal"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			if strings.HasPrefix(path, filepath.Join("internal", "hostname")) || strings.HasPrefix(path, filepath.Join("internal", "testkit")) {
				return nil // the one place, and test support
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(data), "\n") {
				if folding.MatchString(line) && !strings.Contains(line, "// not a name") {
					found = append(found, fmt.Sprintf("%s:%d: %s", path, i+1, strings.TrimSpace(line)))
				}
			}
			return nil
		})
		require.NoError(t, err)
	}
	assert.Empty(t, found, "names folded by hand, not by internal/hostname")
}
