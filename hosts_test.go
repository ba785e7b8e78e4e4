package egress_test

import (
	"net/http"
	"net/url"
	"path/filepath"
	"testing"

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
	v, err := vault.Open(vault.FileStorage{Path: filepath.Join(t.TempDir(), "v")}, make([]byte, vault.KeySize), vault.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pattern := range patterns {
		p, err := policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{pattern + ":*"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Set(vault.Secret{Name: "s", Rule: vault.Rule{Hosts: []string{pattern}, Header: "X-Key"}}, []byte("value")); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Attach("a", "s", "S"); err != nil {
			t.Fatal(err)
		}
		for _, host := range hosts {
			req := &http.Request{URL: &url.URL{Scheme: "https", Host: host, Path: "/"}, Host: host, Header: http.Header{}}
			used, err := v.Inject("a", req)
			if err != nil {
				t.Fatal(err)
			}
			if allowed, injected := p.Decide(host, 443).Allowed, len(used) == 1; allowed != injected {
				t.Errorf("pattern %q, host %q: policy allows=%v, vault injects=%v", pattern, host, allowed, injected)
			}
		}
	}
}
