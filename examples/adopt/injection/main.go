// Command injection uses vault alone: a secret sealed in memory, a
// placeholder for the sandbox, and the real value put into a request to
// the host its rule names only.
package main

import (
	"fmt"
	"net/http"
	"net/url"
	"os"

	"github.com/agenthold/egress/vault"
)

func main() {
	key, err := vault.NewKey()
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{PlaceholderPrefix: "adopt"})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	rule, _ := vault.Preset("openai")
	if err := v.Set(vault.Secret{Name: "openai", Rule: rule}, []byte("sk-real-value")); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	a, err := v.Attach("agent-1", "openai", "OPENAI_API_KEY")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	for _, host := range []string{"api.openai.com", "exfil.example"} {
		req := &http.Request{URL: &url.URL{Scheme: "https", Host: host, Path: "/v1/models"}, Host: host,
			Header: http.Header{"Authorization": {"Bearer " + a.Placeholder}}}
		used, err := v.Inject("agent-1", req)
		fmt.Printf("%s real key: %v used: %v err: %v\n", host, req.Header.Get("Authorization") == "Bearer sk-real-value", used, err)
	}
}
