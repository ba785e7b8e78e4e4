package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/internal/observe"
	"github.com/agenthold/egress/policy"
)

// cmdSuggest proposes the smallest policy file that covers what the
// sandbox did, learnt from serve's JSON-lines log (best run with a policy
// in report mode: enforce: true, report: true). Given the current policy
// file, it keeps its deny entries, DoH endpoints and private-network
// setting.
func cmdSuggest(args []string) error {
	fs := flag.NewFlagSet("suggest", flag.ContinueOnError)
	logPath := fs.String("log", "", "the JSON-lines log serve --log wrote (required)")
	current := fs.String("policy", "", "the current policy file, whose deny entries, doh-endpoints and private-network setting the suggestion keeps")
	collapse := fs.Int("collapse", 0, "collapse N or more sibling names into *.parent (0: never)")
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
		if err := yaml.Unmarshal(b, &keep); err != nil {
			return fmt.Errorf("%s: %w", *current, err)
		}
	}
	f, err := os.Open(*logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	obs, skipped, err := observe.Read(f, "")
	if err != nil {
		return fmt.Errorf("%s: %w", *logPath, err)
	}
	return writeSuggestion(os.Stdout, policy.Suggest(obs, policy.SuggestConfig{Collapse: *collapse}), keep, len(obs), skipped)
}

// suggestedFile is the sidecar's policy file as a suggestion writes it.
type suggestedFile struct {
	Enforce              bool     `yaml:"enforce"`
	AllowOut             []string `yaml:"allowOut"`
	Deny                 []string `yaml:"deny,omitempty"`
	DoHEndpoints         []string `yaml:"doh-endpoints,omitempty"`
	AllowPrivateNetworks bool     `yaml:"allowPrivateNetworks,omitempty"`
}

// writeSuggestion prints a suggestion as the sidecar's policy file, with
// what it keeps of the current one, each entry's support and what was
// only attempted as comments.
func writeSuggestion(w io.Writer, s policy.Suggestion, keep policy.Document, records, skipped int) error {
	fmt.Fprintf(w, "# From %d records (%d unreadable, skipped). Each entry: uses, first and last seen.\n", records, skipped)
	for _, e := range s.Used {
		fmt.Fprintf(w, "#   %-40s %5d  %s  %s\n", e.Entry, e.Count, e.FirstSeen.Format(time.RFC3339), e.LastSeen.Format(time.RFC3339))
	}
	for _, e := range s.Attempted {
		fmt.Fprintf(w, "# only attempted, left out: %s (%d)\n", e.Entry, e.Count)
	}
	out := suggestedFile{Enforce: true, AllowOut: s.Document.Allow, Deny: keep.Deny, DoHEndpoints: keep.DoHEndpoints}
	for _, list := range [][]string{keep.Allow, keep.AllowOut} {
		for _, e := range list {
			if len(e) > 1 && e[0] == '!' {
				out.Deny = append(out.Deny, e[1:]) // a deny entry among the allow entries
			}
		}
	}
	for _, p := range []*bool{keep.AllowPrivateNetworks, keep.AllowPrivateAlias} {
		out.AllowPrivateNetworks = out.AllowPrivateNetworks || (p != nil && *p)
	}
	doc, err := yaml.Marshal(out)
	if err != nil {
		return err
	}
	_, err = w.Write(doc)
	return err
}
