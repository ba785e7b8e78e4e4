package vault

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthold/egress/internal/budget"
)

// Secret names a secret and says where it may go. Its value is given to
// Set and never returned by any method.
type Secret struct {
	Name  string `json:"name"`
	Owner string `json:"owner,omitempty"` // who it belongs to, if anyone; part of its identity
	Rule  Rule   `json:"rule"`
	// Source, if set, is where the value comes from (SetSource): the
	// vault keeps no value of its own.
	Source *Source `json:"source,omitempty"`
}

// Info describes a stored secret: everything but its value.
type Info struct {
	Secret
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
}

// Attachment gives an agent the use of a secret: the sandbox's environment
// variable Env holds Placeholder, which the gateway replaces with the
// value on the way to the rule's hosts.
type Attachment struct {
	Agent       string `json:"agent"`
	Secret      string `json:"secret"`
	Env         string `json:"env"`
	Placeholder string `json:"placeholder"`
}

// DefaultPlaceholderPrefix starts placeholders when Config gives none.
const DefaultPlaceholderPrefix = "egress"

// Config configures a Vault.
type Config struct {
	// PlaceholderPrefix starts every placeholder ("<prefix>-placeholder-…");
	// "" means DefaultPlaceholderPrefix.
	PlaceholderPrefix string
	// Now returns the time; nil means time.Now.
	Now func() time.Time
	// SigV4 re-signs the requests of AWSSigV4 secrets (awssig.Signer);
	// nil refuses them.
	SigV4 SigV4Signer
}

// Vault stores secrets sealed at rest and injects them into requests.
// Values are write-only: set, rotate and delete, never read back. It is
// safe for concurrent use: readers (injection above all) take the current
// state without a lock, and writers, one at a time, publish a new state
// once it is stored, so that a write's disk I/O never stalls a request.
type Vault struct {
	cfg   Config
	store Storage

	writeMu sync.Mutex // serialises writers, across their read, store and publish
	// rotateMu serialises RotateKeyFile, whose steps span more than one
	// writer's turn.
	rotateMu sync.Mutex
	cur      atomic.Pointer[state]
	apps     appTokens      // GitHub App installation tokens, by secret
	buffers  budget.Counter // request bodies read whole, by agent
}

// state is one immutable version of the vault: a writer builds a new one
// and never changes one that was published. Its redactors are a cache of
// what it implies, made as they are asked for.
type state struct {
	key       []byte
	secrets   map[string]*secretEntry
	attach    map[string][]Attachment // by agent, sorted by secret
	redactors sync.Map                // agent, host and covering secrets -> cachedRedactor
}

func newState(key []byte, secrets map[string]*secretEntry, attach map[string][]Attachment) *state {
	return &state{key: key, secrets: secrets, attach: attach}
}

// ErrNotFound is matched (with errors.Is) by the errors about a secret or
// an attachment that does not exist.
var ErrNotFound = errors.New("vault: not found")

// notFound is an error that says what was not found and is ErrNotFound.
type notFound string

func (e notFound) Error() string        { return "vault: " + string(e) }
func (e notFound) Is(target error) bool { return target == ErrNotFound }

func noSecret(name string) error { return notFound(fmt.Sprintf("no secret %q", name)) }

type secretEntry struct {
	stored storedSecret
	rule   *compiledRule
	ad     []byte
	src    *sourceState // the value's source; nil: the sealed value
}

// sourceMarker is what a secret with a source has sealed in place of a
// value, which the vault never holds.
var sourceMarker = []byte("value from its source")

// valueOf is the one place a secret's value is taken from: its source,
// or its sealed value. The caller clears it after use. gen tells one
// value of a source from the next (0 for a sealed value).
func (v *Vault) valueOf(key []byte, e *secretEntry) (value []byte, gen uint64, err error) {
	if e.src != nil {
		value, gen, err = e.src.current(v.now())
		if err != nil {
			return nil, 0, fmt.Errorf("vault: secret %q: %w", e.stored.Name, err)
		}
		return value, gen, nil
	}
	value, err = open(key, e.ad, e.stored.Sealed)
	return value, 0, err
}

// newSource is the state of a secret's source, checked against its rule.
func (v *Vault) newSource(spec Source, rule *compiledRule) *sourceState {
	return &sourceState{spec: spec, check: rule.checkValue, clock: v.now}
}

// Open loads the vault from st with the master key. Nothing stored yet is
// an empty vault; a wrong key, or a damaged, truncated or tampered file,
// is an error, and nothing is loaded.
func Open(st Storage, key []byte, cfg Config) (*Vault, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("vault: master key is %d bytes, want %d", len(key), KeySize)
	}
	if !slices.ContainsFunc(key, func(b byte) bool { return b != 0 }) {
		return nil, errors.New("vault: master key is all zero: a placeholder, not a key (LoadKeyFile or NewKey make one)")
	}
	v := &Vault{cfg: cfg, store: st}
	cur := newState(slices.Clone(key), map[string]*secretEntry{}, map[string][]Attachment{})
	v.cur.Store(cur)
	data, err := st.Load()
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return nil, err
	}
	d, err := decodeDocument(data, key, storageName(st))
	if err != nil {
		return nil, err
	}
	for _, s := range d.Secrets {
		rule, err := s.Rule.compile()
		if err != nil {
			return nil, fmt.Errorf("vault: secret %q: %w", s.Name, err)
		}
		e := &secretEntry{stored: s, rule: rule, ad: recordAD(&s)}
		if s.Source != nil {
			e.src = v.newSource(*s.Source, rule)
		}
		cur.secrets[s.Name] = e
	}
	for _, a := range d.Attachments {
		cur.attach[a.Agent] = append(cur.attach[a.Agent], Attachment(a))
	}
	for agent := range cur.attach {
		sortAttachments(cur.attach[agent])
	}
	return v, nil
}

// storageName names a storage in errors: its path, if it has one.
func storageName(st Storage) string {
	if n, ok := st.(interface{ Name() string }); ok {
		return n.Name()
	}
	return "vault"
}

func (v *Vault) now() time.Time {
	if v.cfg.Now != nil {
		return v.cfg.Now()
	}
	return time.Now().UTC()
}

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Set stores a secret's value and rule, replacing any secret of the same
// name. The rule is checked first.
func (v *Vault) Set(s Secret, value []byte) error {
	if !validName.MatchString(s.Name) {
		return fmt.Errorf("vault: invalid secret name %q (letters, digits, '.', '_', '-')", s.Name)
	}
	if s.Source != nil {
		return errors.New("vault: a secret with a source is set with SetSource, without a value")
	}
	if len(value) == 0 {
		return errors.New("vault: empty value")
	}
	rule, err := s.Rule.compile()
	if err != nil {
		return err
	}
	if err := rule.checkValue(string(value)); err != nil {
		return fmt.Errorf("vault: secret %q: %w", s.Name, err)
	}
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	return v.setLocked(v.cur.Load(), s, rule, value, nil)
}

// SetSource stores a secret whose value comes from s.Source, replacing
// any secret of the same name. The source is read once first: one that
// gives no value the rule can use now is an error, and nothing is
// stored.
func (v *Vault) SetSource(s Secret) error {
	if !validName.MatchString(s.Name) {
		return fmt.Errorf("vault: invalid secret name %q (letters, digits, '.', '_', '-')", s.Name)
	}
	if s.Source == nil {
		return errors.New("vault: SetSource without a source")
	}
	if err := s.Source.check(); err != nil {
		return fmt.Errorf("vault: secret %q: %w", s.Name, err)
	}
	rule, err := s.Rule.compile()
	if err != nil {
		return err
	}
	src := v.newSource(*s.Source, rule)
	value, _, err := src.current(v.now())
	if err != nil {
		return fmt.Errorf("vault: secret %q: %w", s.Name, err)
	}
	clear(value)
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	return v.setLocked(v.cur.Load(), s, rule, sourceMarker, src)
}

// setLocked stores a secret's value under its (compiled) rule; the caller
// holds writeMu and read cur from the current state.
func (v *Vault) setLocked(cur *state, s Secret, rule *compiledRule, value []byte, src *sourceState) error {
	now := v.now()
	st := storedSecret{Name: s.Name, Owner: s.Owner, Rule: s.Rule, Source: s.Source, Created: now, Updated: now}
	if old := cur.secrets[s.Name]; old != nil {
		st.Created = old.stored.Created
	}
	ad := recordAD(&st)
	var err error
	if st.Sealed, err = seal(cur.key, ad, value); err != nil {
		return err
	}
	secrets := maps.Clone(cur.secrets)
	secrets[s.Name] = &secretEntry{stored: st, rule: rule, ad: ad, src: src}
	return v.commit(newState(cur.key, secrets, cur.attach))
}

// SetRule changes the rule of a stored secret, keeping its value.
func (v *Vault) SetRule(name string, r Rule) error {
	rule, err := r.compile()
	if err != nil {
		return err
	}
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	cur := v.cur.Load()
	old := cur.secrets[name]
	if old == nil {
		return noSecret(name)
	}
	sealed, err := open(cur.key, old.ad, old.stored.Sealed)
	if err != nil {
		return fmt.Errorf("vault: secret %q: %w", name, err)
	}
	defer clear(sealed)
	value, _, err := v.valueOf(cur.key, old)
	if err != nil {
		return err
	}
	defer clear(value)
	if err := rule.checkValue(string(value)); err != nil {
		return fmt.Errorf("vault: secret %q: %w", name, err)
	}
	st := old.stored
	st.Rule, st.Updated = r, v.now()
	ad := recordAD(&st)
	if st.Sealed, err = seal(cur.key, ad, sealed); err != nil {
		return err
	}
	var src *sourceState
	if st.Source != nil {
		src = v.newSource(*st.Source, rule) // checked against the new rule from now on
	}
	secrets := maps.Clone(cur.secrets)
	secrets[name] = &secretEntry{stored: st, rule: rule, ad: ad, src: src}
	return v.commit(newState(cur.key, secrets, cur.attach))
}

// Delete removes a secret and every attachment of it.
func (v *Vault) Delete(name string) error {
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	cur := v.cur.Load()
	if cur.secrets[name] == nil {
		return noSecret(name)
	}
	secrets := maps.Clone(cur.secrets)
	delete(secrets, name)
	attach := map[string][]Attachment{}
	for agent, list := range cur.attach {
		for _, a := range list {
			if a.Secret != name {
				attach[agent] = append(attach[agent], a)
			}
		}
	}
	return v.commit(newState(cur.key, secrets, attach))
}

// List returns every secret's name, owner, rule and times, sorted by
// name; never a value.
func (v *Vault) List() []Info {
	cur := v.cur.Load()
	out := make([]Info, 0, len(cur.secrets))
	for _, e := range cur.secrets {
		out = append(out, Info{Secret: Secret{Name: e.stored.Name, Owner: e.stored.Owner, Rule: e.stored.Rule}, Created: e.stored.Created, Updated: e.stored.Updated})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Key returns a copy of the master key the vault is sealed under now, for
// a backup that must carry it. It is the key to every secret: never give
// it to what a sandbox can read.
func (v *Vault) Key() []byte { return slices.Clone(v.cur.Load().key) }

// Rotate re-seals every secret under newKey and stores the result in one
// atomic write; until it returns, the old key opens the vault. Keep the
// new key durable before calling Rotate.
func (v *Vault) Rotate(newKey []byte) error {
	if len(newKey) != KeySize {
		return fmt.Errorf("vault: new key is %d bytes, want %d", len(newKey), KeySize)
	}
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	cur := v.cur.Load()
	secrets := map[string]*secretEntry{}
	for name, e := range cur.secrets {
		value, err := open(cur.key, e.ad, e.stored.Sealed)
		if err != nil {
			return fmt.Errorf("vault: secret %q: %w", name, err)
		}
		st := e.stored
		st.Sealed, err = seal(newKey, e.ad, value)
		clear(value)
		if err != nil {
			return err
		}
		secrets[name] = &secretEntry{stored: st, rule: e.rule, ad: e.ad, src: e.src}
	}
	return v.commit(newState(slices.Clone(newKey), secrets, cur.attach))
}

var validEnv = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// Attach gives agent the use of a secret through the environment variable
// env, and returns the attachment with its placeholder: random, distinct
// per attachment, and stable while it lasts (attaching again returns the
// same one, with the new variable name).
func (v *Vault) Attach(agent, name, env string) (Attachment, error) {
	return v.setAttachment(agent, name, env, "")
}

var validPlaceholder = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{15,127}$`)

// AttachPlaceholder is Attach with a placeholder chosen by the caller: a
// control plane that has already put it in the sandbox's environment. It
// must be at least 16 characters of letters, digits, '.', '_' and '-', and
// not used by another attachment of the agent.
func (v *Vault) AttachPlaceholder(agent, name, env, placeholder string) (Attachment, error) {
	if !validPlaceholder.MatchString(placeholder) {
		return Attachment{}, errors.New("vault: a placeholder must be 16 to 128 letters, digits, '.', '_' or '-'")
	}
	return v.setAttachment(agent, name, env, placeholder)
}

// setAttachment attaches a secret with a placeholder; "" keeps the one
// the attachment has, or makes a new one.
func (v *Vault) setAttachment(agent, name, env, placeholder string) (Attachment, error) {
	if agent == "" {
		return Attachment{}, errors.New("vault: no agent")
	}
	if !validEnv.MatchString(env) {
		return Attachment{}, fmt.Errorf("vault: invalid environment variable name %q", env)
	}
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	cur := v.cur.Load()
	if cur.secrets[name] == nil {
		return Attachment{}, noSecret(name)
	}
	list := slices.Clone(cur.attach[agent])
	i := slices.IndexFunc(list, func(a Attachment) bool { return a.Secret == name })
	switch {
	case placeholder != "":
	case i >= 0:
		placeholder = list[i].Placeholder
	default:
		placeholder = v.newPlaceholder()
	}
	for j, a := range list {
		if j != i && a.Placeholder == placeholder {
			return Attachment{}, fmt.Errorf("vault: placeholder already used for secret %q", a.Secret)
		}
	}
	a := Attachment{Agent: agent, Secret: name, Env: env, Placeholder: placeholder}
	if i >= 0 {
		list[i] = a
	} else {
		list = append(list, a)
	}
	sortAttachments(list)
	attach := mapsAttach(cur.attach)
	attach[agent] = list
	if err := v.commit(newState(cur.key, cur.secrets, attach)); err != nil {
		return Attachment{}, err
	}
	return a, nil
}

// Detach ends an agent's use of a secret; its placeholder stops working.
func (v *Vault) Detach(agent, name string) error {
	v.writeMu.Lock()
	defer v.writeMu.Unlock()
	cur := v.cur.Load()
	list := slices.DeleteFunc(slices.Clone(cur.attach[agent]), func(a Attachment) bool { return a.Secret == name })
	if len(list) == len(cur.attach[agent]) {
		return notFound(fmt.Sprintf("secret %q is not attached to %q", name, agent))
	}
	attach := mapsAttach(cur.attach)
	attach[agent] = list
	return v.commit(newState(cur.key, cur.secrets, attach))
}

// Attachments lists an agent's attachments, sorted by secret name.
func (v *Vault) Attachments(agent string) []Attachment {
	return slices.Clone(v.cur.Load().attach[agent])
}

// Environment is what an agent's sandbox environment holds for its
// secrets, as NAME=VALUE: each attachment's variable set to its
// placeholder and, for an AWS secret, the SDKs' secret key and session
// token variables set to it too, so that any SDK signs with the
// placeholder.
func (v *Vault) Environment(agent string) []string {
	cur := v.cur.Load()
	var env []string
	for _, a := range cur.attach[agent] {
		env = append(env, a.Env+"="+a.Placeholder)
		if e := cur.secrets[a.Secret]; e != nil && e.rule.Mode == AWSSigV4 {
			env = append(env, "AWS_SECRET_ACCESS_KEY="+a.Placeholder, "AWS_SESSION_TOKEN="+a.Placeholder)
		}
	}
	return env
}

func (v *Vault) newPlaceholder() string {
	prefix := v.cfg.PlaceholderPrefix
	if prefix == "" {
		prefix = DefaultPlaceholderPrefix
	}
	b := make([]byte, 16)
	rand.Read(b)
	return prefix + "-placeholder-" + hex.EncodeToString(b)
}

// commit stores the new state and, once stored, makes it current; the
// caller holds writeMu.
func (v *Vault) commit(next *state) error {
	key, secrets, attach := next.key, next.secrets, next.attach
	d := &document{Secrets: []storedSecret{}, Attachments: []storedAttached{}}
	names := make([]string, 0, len(secrets))
	for n := range secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d.Secrets = append(d.Secrets, secrets[n].stored)
	}
	agents := make([]string, 0, len(attach))
	for a := range attach {
		agents = append(agents, a)
	}
	sort.Strings(agents)
	for _, agent := range agents {
		for _, a := range attach[agent] {
			d.Attachments = append(d.Attachments, storedAttached(a))
		}
	}
	data, err := d.encode(key)
	if err != nil {
		return err
	}
	if err := v.store.Save(data); err != nil {
		return err
	}
	v.cur.Store(next)
	return nil
}

func mapsAttach(m map[string][]Attachment) map[string][]Attachment {
	out := make(map[string][]Attachment, len(m)+1)
	for k, l := range m {
		if len(l) > 0 {
			out[k] = l
		}
	}
	return out
}

func sortAttachments(l []Attachment) {
	sort.Slice(l, func(i, j int) bool { return l[i].Secret < l[j].Secret })
}
