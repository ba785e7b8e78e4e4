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
// in report mode: enforce: true, report: true).
func cmdSuggest(args []string) error {
	fs := flag.NewFlagSet("suggest", flag.ContinueOnError)
	logPath := fs.String("log", "", "the JSON-lines log serve --log wrote (required)")
	collapse := fs.Int("collapse", 0, "collapse N or more sibling names into *.parent (0: never)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *logPath == "" {
		return usageError{"suggest needs --log FILE"}
	}
	f, err := os.Open(*logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	obs, err := observe.Read(f, "")
	if err != nil {
		return fmt.Errorf("%s: %w", *logPath, err)
	}
	return writeSuggestion(os.Stdout, policy.Suggest(obs, policy.SuggestConfig{Collapse: *collapse}), len(obs))
}

// writeSuggestion prints a suggestion as the sidecar's policy file, each
// entry's support and what was only attempted as comments.
func writeSuggestion(w io.Writer, s policy.Suggestion, records int) error {
	fmt.Fprintf(w, "# From %d records. Each entry: uses, first and last seen.\n", records)
	for _, e := range s.Used {
		fmt.Fprintf(w, "#   %-40s %5d  %s  %s\n", e.Entry, e.Count, e.FirstSeen.Format(time.RFC3339), e.LastSeen.Format(time.RFC3339))
	}
	for _, e := range s.Attempted {
		fmt.Fprintf(w, "# only attempted, left out: %s (%d)\n", e.Entry, e.Count)
	}
	doc, err := yaml.Marshal(struct {
		Enforce  bool     `yaml:"enforce"`
		AllowOut []string `yaml:"allowOut"`
	}{true, s.Document.Allow})
	if err != nil {
		return err
	}
	_, err = w.Write(doc)
	return err
}
