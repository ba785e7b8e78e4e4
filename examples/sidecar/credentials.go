//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/vault"
	"github.com/agenthold/egress/vault/awssig"
)

// Credential is one entry of the credentials file the control plane
// writes to the sidecar's own tmpfs: already resolved, so the sidecar
// needs no template engine and never learns the secrets' names.
//
//   - hosts: [api.anthropic.com]
//     header: x-api-key
//     value: sk-ant-…                      # the header's whole value
//     placeholder: sbx-placeholder-…       # the decoy in the sandbox's environment
//   - hosts: ["*.amazonaws.com"]
//     mode: aws-sigv4                      # the sandbox signs with the placeholder
//     value: AKIA…:secret[:session-token]  # as its key ID, secret key and token
//     placeholder: sbx-placeholder-…
//
// Instead of value, valueFile names a file the sidecar reads the value
// from, again whenever it changes (a Kubernetes Secret mounted into the
// sidecar alone), and valueCommand a command it runs for it (its output;
// again every refresh, 5m by default); a source that fails keeps its last
// value for maxStale (15m), then the entry's requests are refused
// (vault.Source).
//
// Mode is inject (the default), aws-sigv4 or github-app (the value is the
// App's JSON: app_id, installation_id, private_key), as vault's rules;
// replaceIn and bodyTypes opt an inject entry into replacing its
// placeholder in paths, bodies or WebSocket messages.
type Credential struct {
	Hosts        []string      `yaml:"hosts"`
	Header       string        `yaml:"header"`
	Value        string        `yaml:"value"`
	ValueFile    string        `yaml:"valueFile"`
	ValueCommand []string      `yaml:"valueCommand"`
	Refresh      time.Duration `yaml:"refresh"`
	MaxStale     time.Duration `yaml:"maxStale"`
	Placeholder  string        `yaml:"placeholder"`
	Paths        []string      `yaml:"paths"`
	Mode         string        `yaml:"mode"`
	ReplaceIn    []string      `yaml:"replaceIn"`
	BodyTypes    []string      `yaml:"bodyTypes"`
}

// rule is the vault rule of a credential.
func (c Credential) rule() vault.Rule {
	r := vault.Rule{Hosts: c.Hosts, Paths: c.Paths, Mode: vault.Mode(c.Mode)}
	if r.Mode == "" || r.Mode == vault.Inject {
		r.Header, r.ReplaceIn, r.BodyTypes = c.Header, c.ReplaceIn, c.BodyTypes
		if c.Header != "" {
			r.Template = "{{.Value}}"
		}
	}
	return r
}

// store puts the credential in the vault as name: its value, or its
// source.
func (c Credential) store(v *vault.Vault, name string) error {
	sourced := c.ValueFile != "" || len(c.ValueCommand) > 0
	switch {
	case sourced && c.Value != "":
		return errors.New("give value, valueFile or valueCommand, one of them")
	case sourced:
		src := vault.Source{File: c.ValueFile, Command: c.ValueCommand, Refresh: c.Refresh, MaxStale: c.MaxStale}
		return v.SetSource(vault.Secret{Name: name, Rule: c.rule(), Source: &src})
	}
	return v.Set(vault.Secret{Name: name, Rule: c.rule()}, []byte(c.Value))
}

// sandboxAgent is the one agent a sidecar serves.
const sandboxAgent = "sandbox"

// loadCredentials reads the credentials file into a vault that lives in
// memory only, sealed under a key that is never written anywhere. An
// absent file means no credentials; a damaged one is an error.
func loadCredentials(path string) (*vault.Vault, int, error) {
	key, err := vault.NewKey()
	if err != nil {
		return nil, 0, err
	}
	v, err := vault.Open(&vault.MemoryStorage{}, key, vault.Config{PlaceholderPrefix: "sidecar", SigV4: awssig.Signer{}})
	clear(key)
	if err != nil {
		return nil, 0, err
	}
	if path == "" {
		return v, 0, nil
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return v, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("credentials: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, 0, fmt.Errorf("credentials: %s has mode %v; it must be 0600", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, fmt.Errorf("credentials: %w", err)
	}
	var creds []Credential
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&creds); err != nil && len(bytes.TrimSpace(data)) > 0 {
		return nil, 0, fmt.Errorf("credentials %s: %w", path, err)
	}
	clear(data)
	for i, c := range creds {
		name := "credential-" + strconv.Itoa(i)
		if err := c.store(v, name); err != nil {
			return nil, 0, fmt.Errorf("credentials entry %d: %w", i, err)
		}
		if c.Placeholder != "" {
			if _, err := v.AttachPlaceholder(sandboxAgent, name, "CREDENTIAL_"+strconv.Itoa(i), c.Placeholder); err != nil {
				return nil, 0, fmt.Errorf("credentials entry %d: %w", i, err)
			}
		} else if _, err := v.Attach(sandboxAgent, name, "CREDENTIAL_"+strconv.Itoa(i)); err != nil {
			return nil, 0, fmt.Errorf("credentials entry %d: %w", i, err)
		}
	}
	return v, len(creds), nil
}
