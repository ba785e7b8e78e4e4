package vault

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/redact"
)

// clock is a vault's time, moved by the test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// sourcedVault is a vault with a clock of its own and one agent
// attached to the secret "tok" set from src, for api.example.com.
func sourcedVault(t *testing.T, src Source) (*Vault, *clock, string) {
	c := &clock{now: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)}
	v, err := Open(FileStorage{Path: filepath.Join(t.TempDir(), "secrets.json")}, testKey(1), Config{Now: c.Now})
	require.NoError(t, err)
	require.NoError(t, v.SetSource(Secret{Name: "tok", Rule: hostRule("api"), Source: &src}))
	a, err := v.Attach("a1", "tok", "TOKEN")
	require.NoError(t, err)
	return v, c, a.Placeholder
}

// injected is the value a request to api.example gets, or the error.
func injected(t *testing.T, v *Vault, placeholder string) (string, error) {
	req := newRequest(t, "https://api.example/", nil)
	req.Header.Set("Authorization", "Bearer "+placeholder)
	_, err := v.Inject("a1", req)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "), err
}

// writeSecretFile replaces path as a mounted Kubernetes Secret is: a new
// file renamed over the old.
func writeSecretFile(t *testing.T, path, value string) {
	require.NoError(t, os.WriteFile(path+".new", []byte(value), 0o600))
	require.NoError(t, os.Rename(path+".new", path))
}

// TestFileSource: the value follows a file rotated underneath; when the
// file goes, the last value serves for MaxStale, then the secret is
// refused with a reason that holds no value; redaction follows the value.
func TestFileSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeSecretFile(t, path, "tok-one\n")
	v, c, ph := sourcedVault(t, Source{File: path, MaxStale: 10 * time.Minute})
	got, err := injected(t, v, ph)
	require.NoError(t, err)
	assert.Equal(t, "tok-one", got, "the file's value, without its newline")

	writeSecretFile(t, path, "tok-two")
	c.Add(2 * fileCheckEvery)
	got, err = injected(t, v, ph)
	require.NoError(t, err)
	assert.Equal(t, "tok-two", got, "the rotated file's value")
	red, err := v.Redactor("a1", "api.example")
	require.NoError(t, err)
	assert.Equal(t, "echo "+ph, red.String("echo tok-two"), "the new value is redacted")

	require.NoError(t, os.Remove(path))
	c.Add(5 * time.Minute)
	got, err = injected(t, v, ph)
	require.NoError(t, err, "within MaxStale of the file's going")
	assert.Equal(t, "tok-two", got)
	c.Add(6 * time.Minute)
	_, err = injected(t, v, ph)
	require.Error(t, err, "a value older than MaxStale served")
	assert.Contains(t, err.Error(), "no such file")
	assert.NotContains(t, err.Error(), "tok-")

	writeSecretFile(t, path, "tok-three")
	c.Add(2 * fileCheckEvery)
	got, err = injected(t, v, ph)
	require.NoError(t, err, "the file back")
	assert.Equal(t, "tok-three", got)
}

// commandScript writes a script that prints the content of a file of the
// test's (its next token), or fails, or hangs, as the test says.
func commandScript(t *testing.T) (script, tokenFile string) {
	dir := t.TempDir()
	tokenFile = filepath.Join(dir, "next")
	script = filepath.Join(dir, "token.sh")
	require.NoError(t, os.WriteFile(script, []byte(`#!/bin/sh
t=$(cat "$1")
case "$t" in
fail*) echo "$t"; exit 3 ;;
hang*) sleep 5 ;;
esac
echo "$t"
`), 0o755))
	return script, tokenFile
}

// TestCommandSource: a command's token is fetched at first use, again in
// the background once older than Refresh, kept through failures for
// MaxStale, then refused; what a failing command printed never reaches an
// error.
func TestCommandSource(t *testing.T) {
	script, next := commandScript(t)
	require.NoError(t, os.WriteFile(next, []byte("tok-a"), 0o600))
	v, c, ph := sourcedVault(t, Source{Command: []string{script, next}, Refresh: time.Minute, MaxStale: 10 * time.Minute, Timeout: 2 * time.Second})
	got, err := injected(t, v, ph)
	require.NoError(t, err)
	assert.Equal(t, "tok-a", got)

	require.NoError(t, os.WriteFile(next, []byte("tok-b"), 0o600))
	c.Add(2 * time.Minute)
	got, err = injected(t, v, ph)
	require.NoError(t, err)
	assert.Equal(t, "tok-a", got, "the refresh runs in the background; the request does not wait for it")
	require.Eventually(t, func() bool { got, err = injected(t, v, ph); return err == nil && got == "tok-b" }, 5*time.Second, 10*time.Millisecond, "refreshed")

	require.NoError(t, os.WriteFile(next, []byte("fail-tok-leak"), 0o600))
	c.Add(2 * time.Minute)
	injected(t, v, ph) // starts the failing refresh
	e := v.cur.Load().secrets["tok"].src
	require.Eventually(t, func() bool { e.mu.Lock(); defer e.mu.Unlock(); return !e.refreshing && e.failure != nil }, 5*time.Second, 10*time.Millisecond)
	got, err = injected(t, v, ph)
	require.NoError(t, err, "the last good value within MaxStale")
	assert.Equal(t, "tok-b", got)
	c.Add(15 * time.Minute)
	_, err = injected(t, v, ph)
	require.Error(t, err, "a value older than MaxStale served")
	assert.Contains(t, err.Error(), "exit status 3")
	assert.NotContains(t, err.Error(), "leak", "what the command printed reached an error")
}

// TestSourceRefusedAtSet: a source that gives no usable value now, or is
// not absolute, or is both a file and a command, stores nothing; a
// command that hangs is cut at its timeout.
func TestSourceRefusedAtSet(t *testing.T) {
	script, next := commandScript(t)
	require.NoError(t, os.WriteFile(next, []byte("hang"), 0o600))
	v, err := Open(&MemoryStorage{}, testKey(1), Config{})
	require.NoError(t, err)
	for _, src := range []Source{
		{File: "relative/token"},
		{File: "/nonexistent/token"},
		{Command: []string{"sh", "-c", "echo x"}},
		{File: "/etc/hostname", Command: []string{"/bin/true"}},
		{Command: []string{"/bin/true"}}, // an empty value
		{Command: []string{script, next}, Timeout: 200 * time.Millisecond},
		{File: "/etc/hostname", MaxStale: -time.Second},
	} {
		err := v.SetSource(Secret{Name: "tok", Rule: hostRule("api"), Source: &src})
		assert.Error(t, err, "%+v", src)
	}
	assert.Empty(t, v.List())
	require.Error(t, v.Set(Secret{Name: "tok", Rule: hostRule("api"), Source: &Source{File: "/etc/hostname"}}, []byte("x")), "Set with a source")
}

// TestSourcePersists: a secret's source is stored (never a value of it),
// bound to its record, and read again after the vault is opened again.
func TestSourcePersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeSecretFile(t, path, "tok-persisted")
	st := FileStorage{Path: filepath.Join(t.TempDir(), "secrets.json")}
	v, err := Open(st, testKey(1), Config{})
	require.NoError(t, err)
	require.NoError(t, v.SetSource(Secret{Name: "tok", Rule: hostRule("api"), Source: &Source{File: path}}))
	a, err := v.Attach("a1", "tok", "TOKEN")
	require.NoError(t, err)
	data, err := os.ReadFile(st.Path)
	require.NoError(t, err)
	assert.NotContains(t, string(data), "tok-persisted")
	assert.Contains(t, string(data), path)
	require.Error(t, v.Replace("tok", []byte("other")), "Replace on a sourced secret")

	v2, err := Open(st, testKey(1), Config{})
	require.NoError(t, err)
	got, err := injected(t, v2, a.Placeholder)
	require.NoError(t, err)
	assert.Equal(t, "tok-persisted", got)

	edited := strings.Replace(string(data), path, "/etc/shadow", 1)
	require.NoError(t, os.WriteFile(st.Path, []byte(edited), 0o600))
	_, err = Open(st, testKey(1), Config{})
	assert.Error(t, err, "a source moved to another file by editing the vault")
}

// TestSourceChangeNeverUnredacted: a source's value that changed after
// the answer's redactor was made is refused, not sent: the answer would
// echo it unredacted. Sent again, the request is redacted with the new
// value.
func TestSourceChangeNeverUnredacted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeSecretFile(t, path, "tok-before")
	v, c, ph := sourcedVault(t, Source{File: path})
	red, err := v.Redactor("a1", "api.example")
	require.NoError(t, err)
	writeSecretFile(t, path, "tok-after")
	c.Add(2 * fileCheckEvery)
	req := newRequest(t, "https://api.example/", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	req = req.WithContext(redact.WithReplacer(req.Context(), red))
	_, err = v.Inject("a1", req)
	var refused *RefusedError
	require.ErrorAs(t, err, &refused, "a value the answer's redactor does not know was injected")
	assert.NotContains(t, req.Header.Get("Authorization"), "tok-after")

	red, err = v.Redactor("a1", "api.example")
	require.NoError(t, err)
	req = newRequest(t, "https://api.example/", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	req = req.WithContext(redact.WithReplacer(req.Context(), red))
	_, err = v.Inject("a1", req)
	require.NoError(t, err)
	assert.Equal(t, "Bearer tok-after", req.Header.Get("Authorization"))
	assert.Equal(t, "echo "+ph, red.String("echo tok-after"))
}

// TestFailingCommandBacksOff: a command that fails is not run again for
// every request that needs it: at most once per sourceRetry.
func TestFailingCommandBacksOff(t *testing.T) {
	dir := t.TempDir()
	script, runs := filepath.Join(dir, "fail.sh"), filepath.Join(dir, "runs")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho run >> \""+runs+"\"\n[ -f \""+dir+"/ok\" ] && { echo tok-ok; exit 0; }\nexit 1\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ok"), nil, 0o600))
	v, c, ph := sourcedVault(t, Source{Command: []string{script}, Refresh: time.Hour})
	require.NoError(t, os.Remove(filepath.Join(dir, "ok")))
	// A vault opened again has no value yet: each request would run it.
	v2, err := Open(v.store, testKey(1), Config{Now: c.Now})
	require.NoError(t, err)
	require.NoError(t, os.Remove(runs))
	for range 20 {
		_, err := injected(t, v2, ph)
		assert.Error(t, err)
	}
	data, _ := os.ReadFile(runs)
	assert.Equal(t, 1, strings.Count(string(data), "run"), "a failing command ran for every request")
	c.Add(sourceRetry)
	injected(t, v2, ph)
	data, _ = os.ReadFile(runs)
	assert.Equal(t, 2, strings.Count(string(data), "run"), "run again after sourceRetry")
}

// TestSourceFileOthersCouldWrite: a file another user owns, or one in a
// directory others may write (where an agent could swap it for a link to
// the master key), is refused.
func TestSourceFileOthersCouldWrite(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a file another user owns")
	}
	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(open, 0o777))
	require.NoError(t, os.Chmod(open, 0o777))
	inOpen := filepath.Join(open, "token")
	require.NoError(t, os.WriteFile(inOpen, []byte("tok"), 0o600))
	owned := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(owned, []byte("tok"), 0o600))
	require.NoError(t, os.Chown(owned, 4242, 4242))
	v, err := Open(&MemoryStorage{}, testKey(1), Config{})
	require.NoError(t, err)
	for _, path := range []string{inOpen, owned} {
		err := v.SetSource(Secret{Name: "tok", Rule: hostRule("api"), Source: &Source{File: path}})
		assert.ErrorContains(t, err, "another user could change the value", path)
	}
}

// TestSourceFileOthersCouldRead: a file others may read (a Kubernetes
// Secret's files are 0644 by default), or whose group (not root's, not
// the gateway's) may, or a link to one, is refused: a sandbox that sees
// the host's files would read the value itself. Root's group and the
// gateway's may read it.
func TestSourceFileOthersCouldRead(t *testing.T) {
	dir := t.TempDir()
	for _, mode := range []os.FileMode{0o644, 0o604, 0o640} {
		path := filepath.Join(dir, "token"+mode.String())
		require.NoError(t, os.WriteFile(path, []byte("tok"), 0o600))
		require.NoError(t, os.Chmod(path, mode))
		if mode == 0o640 {
			if os.Getuid() != 0 {
				continue // needs root to give the file a group of a sandbox's
			}
			require.NoError(t, os.Chown(path, os.Getuid(), 4242))
		}
		link := path + ".link"
		require.NoError(t, os.Symlink(path, link))
		v, err := Open(&MemoryStorage{}, testKey(1), Config{})
		require.NoError(t, err)
		for _, p := range []string{path, link} {
			err := v.SetSource(Secret{Name: "tok", Rule: hostRule("api"), Source: &Source{File: p}})
			assert.ErrorContains(t, err, "readable by others", p)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o440} {
		private := filepath.Join(dir, "private"+mode.String())
		require.NoError(t, os.WriteFile(private, []byte("tok"), 0o600))
		require.NoError(t, os.Chmod(private, mode))
		v, err := Open(&MemoryStorage{}, testKey(1), Config{})
		require.NoError(t, err)
		assert.NoError(t, v.SetSource(Secret{Name: "tok", Rule: hostRule("api"), Source: &Source{File: private}}), "mode %v", mode)
	}
}
