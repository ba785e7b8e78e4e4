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
// rules. Only Inject (and, to know what to redact, Redactor) opens a
// value, at the moment it fills a request.
//
// Attaching a secret to an agent yields a placeholder for the sandbox's
// environment ("<prefix>-placeholder-<random>"). Inject replaces it, and
// sets the rule's header, only for that agent and only on requests to the
// rule's hosts and paths; a placeholder bound anywhere else leaves
// unchanged. Where an inject rule replaces its placeholder is its
// ReplaceIn (headers and query by default, or its own header alone).
// Login rules replace the placeholder inside the one header the client
// sent and never add it. Refresh rules (an OAuth refresh token) are never
// injected: only the gateway's own grant sends them (FillBody), and a
// request that carries their placeholder elsewhere is refused. AWSSigV4
// rules hold AWS credentials: the sandbox signs with the placeholder as
// its access key ID, secret key and session token (Environment sets all
// three), and Inject re-signs a request signed with it (Authorization
// header or presigned query, over the same signed headers and time, with
// the Config's SigV4Signer: awssig.Signer, AWS's own; none refuses); a
// request signed with any other key, or with
// signed chunks the gateway cannot re-sign, is refused. GitHubApp rules
// hold a GitHub App's key: the gateway mints installation tokens with it
// (through the client SetTokenClient gives, the gateway's own guarded
// path), caches each until shortly before it expires, and sets it as the
// Authorization of API and git requests; the redactor knows the current
// token and the one before. A
// path-limited rule matches only plain paths: no dot or empty segments,
// backslashes or semicolons. A rule's hosts are names and "*." patterns,
// as a policy's entries: a URL or a port is an error.
//
// Redactor gives, for an agent's exchange with a host, the replacer that
// puts its placeholders back wherever the response echoes a value of a
// secret whose rule names the host: raw, JSON-escaped, URL-encoded,
// base64 in each alphabet and alignment, and the rule's rendering ("Bearer
// …", "Basic …"). mitm applies it to headers, bodies, trailers and
// WebSocket frames, so that a host that echoes what it was sent shows the
// sandbox its placeholder.
//
// A secret set with SetSource keeps no value: its Source, a file read
// again when it changes or a command the gateway runs, gives it, and the
// vault holds it in memory only. Every use of a value, stored or
// sourced, goes through one place (valueOf). A source's value that
// changed after the answer's redactor was made is refused, not injected:
// mitm puts the redactor in the request's context for that. A failing
// source keeps its last value for MaxStale, then refuses with its
// reason, which never holds what it printed.
//
// RotateKeyFile re-seals the vault under a new key in its key file so
// that a crash at any step leaves a vault that opens (RecoverKeyFile runs
// at the next start).
//
// A file that fails to open names itself and, where it can, the record
// that failed; a wrong master key is told apart from a modified file.
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
// vault imports the standard library and golang.org/x only (the AWS SDK
// comes with vault/awssig, for those who re-sign AWS requests); it knows
// nothing of TLS interception (mitm calls Inject).
package vault
