package policyfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/policy"
)

// Reasons for the deny-all policies that Parse and Load return (besides
// policy.ReasonNotEnforced and policy.ReasonEnforceUnset).
const (
	ReasonFileAbsent  = "policy file absent"
	ReasonFileEmpty   = "policy file empty"
	ReasonFileInvalid = "policy file invalid"
	ReasonFileUnread  = "policy file unreadable"
)

// MaxDocumentSize bounds the policy file; a larger one denies everything.
const MaxDocumentSize = 4 << 20

// Parse compiles a policy document (policy.Document). It never returns
// nil: if the document is empty, unparseable or invalid, the policy
// denies everything, says why, and the error gives the detail.
func Parse(data []byte) (*policy.Policy, error) {
	doc, reason, err := decode(data)
	if err != nil {
		return policy.Deny(reason), err
	}
	p, err := doc.Compile()
	if err != nil {
		return policy.Deny(ReasonFileInvalid), err
	}
	return p, nil
}

// Decode reads a policy document as Parse does, without compiling it:
// one YAML or JSON document, every key known. An unknown key is an error
// that names it, and the key meant where one differs only in spelling.
func Decode(data []byte) (policy.Document, error) {
	doc, _, err := decode(data)
	return doc, err
}

// decode is Decode, with the reason a policy that failed it denies.
func decode(data []byte) (policy.Document, string, error) {
	var doc policy.Document
	if len(bytes.TrimSpace(data)) == 0 {
		return doc, ReasonFileEmpty, errors.New("policy: document is empty")
	}
	if len(data) > MaxDocumentSize {
		return doc, ReasonFileInvalid, fmt.Errorf("policy: document is larger than %d bytes", MaxDocumentSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return doc, ReasonFileEmpty, errors.New("policy: document is empty")
		}
		return doc, ReasonFileInvalid, fmt.Errorf("policy: parse: %w", withSuggestions(err))
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return doc, ReasonFileInvalid, errors.New("policy: more than one document in the file")
	}
	return doc, "", nil
}

// Load reads and compiles the policy file at path. Like Parse it never
// returns nil, and every failure denies everything.
func Load(path string) (*policy.Policy, error) {
	p, _, err := load(path)
	return p, err
}

// load is Load that also returns the bytes it read.
func load(path string) (*policy.Policy, []byte, error) {
	data, err := readLimited(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return policy.Deny(ReasonFileAbsent), nil, fmt.Errorf("policy: %w", err)
	case err != nil:
		return policy.Deny(ReasonFileUnread), nil, fmt.Errorf("policy: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		err = fmt.Errorf("%w (in %s)", err, path)
	}
	return p, data, err
}

// readLimited reads a file, or up to one byte more than MaxDocumentSize of
// it, which Parse then refuses.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxDocumentSize+1))
}

// unknownField finds the key a yaml error names as unknown.
var unknownField = regexp.MustCompile(`field (\S+) not found in type`)

// withSuggestions adds to a decoding error, for each unknown key it
// names, the document's key that differs from it only in spelling
// (allow-private-networks: allowPrivateNetworks).
func withSuggestions(err error) error {
	var hints []string
	for _, m := range unknownField.FindAllStringSubmatch(err.Error(), -1) {
		if k, ok := knownKeys()[fold(m[1])]; ok {
			hints = append(hints, fmt.Sprintf("%q is spelt %q", m[1], k))
		}
	}
	if len(hints) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(hints, "; "))
}

// knownKeys are the document's keys, by their folded form.
func knownKeys() map[string]string {
	keys := map[string]string{}
	for _, t := range []reflect.Type{reflect.TypeFor[policy.Document](), reflect.TypeFor[policy.Quotas]()} {
		for f := range t.Fields() {
			if k, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); k != "" && k != "-" {
				keys[fold(k)] = k
			}
		}
	}
	return keys
}

// fold is a key without case, dashes or underscores.
func fold(k string) string {
	return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(k)) // not a name: a document key
}
