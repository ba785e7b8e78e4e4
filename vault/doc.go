// Package vault keeps secrets a sandbox may use but never read, and puts
// them into the requests its rules allow.
//
// Each value is sealed with XChaCha20-Poly1305 under a 32-byte master key
// (a file created on first use with mode 0600, or an environment
// variable), with a fresh random 24-byte nonce and the record's identity
// and rule as associated data, so that a value moved to another record,
// or a rule edited to send it elsewhere, no longer opens. The file as a
// whole is authenticated too, and written atomically. Values are
// write-only through every method: set, rotate, delete, list names and
// rules. Only Inject opens a value, at the moment it fills a request.
//
// Attaching a secret to an agent yields a placeholder for the sandbox's
// environment ("<prefix>-placeholder-<random>"). Inject replaces it, and
// sets the rule's header, only for that agent and only on requests to the
// rule's hosts and paths; a placeholder bound anywhere else leaves
// unchanged. Login rules replace the placeholder inside the one header
// the client sent and never add it. A path-limited rule matches only
// plain paths: no dot or empty segments, backslashes or semicolons.
//
// Name in a rule only hosts trusted with the value. The gateway does not
// rewrite responses, so a host that echoes request headers back (an HTTP
// echo service, a debugging endpoint) would show the injected value to
// the sandbox.
//
// Typical use (ExampleVault_Inject runs it):
//
//	key, err := vault.LoadKeyFile(filepath.Join(dataDir, "master.key"))
//	v, err := vault.Open(vault.FileStorage{Path: filepath.Join(dataDir, "secrets.json")}, key, vault.Config{PlaceholderPrefix: "agenthold"})
//	rule, _ := vault.Preset("github")
//	err = v.Set(vault.Secret{Name: "github", Rule: rule}, tokenFromStdin)
//	a, err := v.Attach("agent-1", "github", "GITHUB_TOKEN") // a.Placeholder goes in the sandbox
//	used, err := v.Inject("agent-1", outgoingRequest)       // at the gateway, in mitm
//
// vault imports only the standard library and golang.org/x; it knows
// nothing of TLS interception (mitm calls Inject).
package vault
