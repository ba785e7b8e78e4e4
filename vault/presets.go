package vault

import "sort"

// presets are the injection rules of well-known services, as their
// documentation describes authentication.
var presets = map[string]Rule{
	// Anthropic API: the key in x-api-key.
	"anthropic": {Hosts: []string{"api.anthropic.com"}, Header: "x-api-key", Template: "{{.Value}}"},
	// OpenAI API: a bearer token.
	"openai": {Hosts: []string{"api.openai.com"}, Header: "Authorization", Template: "Bearer {{.Value}}"},
	// GitHub REST and GraphQL API: a bearer token.
	"github": {Hosts: []string{"api.github.com"}, Header: "Authorization", Template: "Bearer {{.Value}}"},
	// git over HTTPS to GitHub: basic authentication with the token as the
	// password of x-access-token.
	"github-git": {Hosts: []string{"github.com"}, Header: "Authorization", Template: `Basic {{base64 (print "x-access-token:" .Value)}}`},
	// GitLab API: a personal, project or group access token.
	"gitlab": {Hosts: []string{"gitlab.com"}, Header: "PRIVATE-TOKEN", Template: "{{.Value}}", Paths: []string{"/api/"}},
	// git over HTTPS to GitLab: basic authentication as oauth2.
	"gitlab-git": {Hosts: []string{"gitlab.com"}, Header: "Authorization", Template: `Basic {{base64 (print "oauth2:" .Value)}}`},
	// AWS: requests signed in the sandbox with the placeholder are
	// re-signed (SigV4) with the real access key.
	"aws": {Hosts: []string{"*.amazonaws.com"}, Mode: AWSSigV4},
	// A GitHub App: installation tokens minted at the gateway, for the
	// API and for git over HTTPS.
	"github-app": {Hosts: []string{"api.github.com", "github.com"}, Mode: GitHubApp},
	// OpenRouter API: a bearer token.
	"openrouter": {Hosts: []string{"openrouter.ai"}, Header: "Authorization", Template: "Bearer {{.Value}}"},
}

// Preset returns the injection rule of a well-known service: anthropic,
// openai, github, github-git, github-app, gitlab, gitlab-git, openrouter,
// aws.
func Preset(name string) (Rule, bool) {
	r, ok := presets[name]
	if !ok {
		return Rule{}, false
	}
	r.Hosts = append([]string(nil), r.Hosts...)
	r.Paths = append([]string(nil), r.Paths...)
	return r, true
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	out := make([]string, 0, len(presets))
	for n := range presets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
