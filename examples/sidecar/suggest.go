//go:build linux

package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/learn"
	"github.com/agenthold/egress/policy/policyfile"
)

// cmdSuggest proposes the smallest policy file that covers what the
// sandbox did, learnt from serve's JSON-lines log (best run with a policy
// in report mode: enforce: true, report: true). Given the current policy
// file, it keeps its deny entries, DoH endpoints and private-network
// setting.
func cmdSuggest(args []string) error {
	fs := flag.NewFlagSet("suggest", flag.ContinueOnError)
	logPath := fs.String("log", "", "the JSON-lines log serve --log wrote (required)")
	current := fs.String("policy", "", "the current policy file, whose deny entries, dohEndpoints and private-network setting the suggestion keeps")
	collapse := fs.Int("collapse", 0, "collapse N or more sibling names into *.parent (0: never)")
	requests := fs.Bool("requests", false, "propose request entries (method and path) for hosts whose requests were seen")
	collapseIDs := fs.Bool("collapse-ids", false, "with --requests: write ID-like path segments as *")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *logPath == "" {
		return usageError{"suggest needs --log FILE"}
	}
	var keep policy.Document
	if *current != "" {
		b, err := os.ReadFile(*current)
		if err != nil {
			return err
		}
		if keep, err = policyfile.Decode(b); err != nil {
			return fmt.Errorf("%s: %w", *current, err)
		}
	}
	f, err := os.Open(*logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	obs, skipped, err := learn.Read(f, "")
	if err != nil {
		return fmt.Errorf("%s: %w", *logPath, err)
	}
	return writeSuggestion(os.Stdout, policy.Suggest(obs, policy.SuggestConfig{Collapse: *collapse, Requests: *requests, CollapseIDs: *collapseIDs}), keep, len(obs), skipped)
}

// suggestedFile is the sidecar's policy file as a suggestion writes it.
type suggestedFile struct {
	Enforce              bool     `yaml:"enforce"`
	AllowOut             []string `yaml:"allowOut"`
	Deny                 []string `yaml:"deny,omitempty"`
	DoHEndpoints         []string `yaml:"dohEndpoints,omitempty"`
	AllowPrivateNetworks bool     `yaml:"allowPrivateNetworks,omitempty"`
}

// writeSuggestion prints a suggestion as the sidecar's policy file, with
// what it keeps of the current one, each entry's support and what was
// only attempted as comments.
func writeSuggestion(w io.Writer, s policy.Suggestion, keep policy.Document, records, skipped int) error {
	learn.WriteSupport(w, s, "", records, skipped)
	out := suggestedFile{Enforce: true, AllowOut: s.Document.Allow, Deny: keep.Deny, DoHEndpoints: keep.DoHEndpoints}
	for _, list := range [][]string{keep.Allow, keep.AllowOut} {
		for _, e := range list {
			if len(e) > 1 && e[0] == '!' {
				out.Deny = append(out.Deny, e[1:]) // a deny entry among the allow entries
			}
		}
	}
	out.AllowPrivateNetworks = keep.AllowPrivateNetworks
	doc, err := yaml.Marshal(out)
	if err != nil {
		return err
	}
	_, err = w.Write(doc)
	return err
}
