package vault_test

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/agenthold/egress/vault"
)

func ExampleVault_Inject() {
	key, err := vault.NewKey() // a vault in memory; on disk: vault.LoadKeyFile
	if err != nil {
		panic(err)
	}
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{PlaceholderPrefix: "agenthold"})
	if err != nil {
		panic(err)
	}
	rule, _ := vault.Preset("openai")
	if err := v.Set(vault.Secret{Name: "openai", Rule: rule}, []byte("sk-real-value")); err != nil {
		panic(err)
	}
	a, _ := v.Attach("agent-1", "openai", "OPENAI_API_KEY")
	fmt.Println("the sandbox sees:", a.Env+"="+a.Placeholder[:22]+"…")

	for _, host := range []string{"api.openai.com", "echo.example.com"} {
		req := &http.Request{URL: &url.URL{Scheme: "https", Host: host, Path: "/v1/models"}, Host: host,
			Header: http.Header{"Authorization": {"Bearer " + a.Placeholder}}}
		used, _ := v.Inject("agent-1", req)
		fmt.Printf("%s gets %q (secrets used: %v)\n", host, req.Header.Get("Authorization")[:13], used)
	}
	// Output:
	// the sandbox sees: OPENAI_API_KEY=agenthold-placeholder-…
	// api.openai.com gets "Bearer sk-rea" (secrets used: [openai])
	// echo.example.com gets "Bearer agenth" (secrets used: [])
}

// A secret's rule says which hosts it may go to; the gateway intercepts
// only the TLS an agent's rules cover, and a placeholder sent anywhere
// else goes out as it is.
func ExampleVault_Covers() {
	key, err := vault.NewKey()
	if err != nil {
		panic(err)
	}
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{})
	if err != nil {
		panic(err)
	}
	rule, _ := vault.Preset("github")
	if err := v.Set(vault.Secret{Name: "gh", Rule: rule}, []byte("ghp_real")); err != nil {
		panic(err)
	}
	if _, err := v.Attach("agent-1", "gh", "GITHUB_TOKEN"); err != nil {
		panic(err)
	}
	for _, host := range []string{"api.github.com", "github.com", "evil.example"} {
		fmt.Println(host, v.Covers("agent-1", host), v.Covers("agent-2", host))
	}
	fmt.Println(v.Set(vault.Secret{Name: "bad", Rule: vault.Rule{Hosts: []string{"https://api.example.com"}, Header: "Authorization"}}, []byte("x")))
	// Output:
	// api.github.com true false
	// github.com false false
	// evil.example false false
	// vault: host "https://api.example.com": hosts are names, not URLs (api.example.com, *.example.com)
}
