package vault

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// substVault holds secret "bot" (inject, for api.telegram.test) with the
// given places, attached to a1.
func substVault(t *testing.T, places []string, bodyTypes []string) (*Vault, string) {
	v, err := Open(&MemoryStorage{}, testKey(1), Config{PlaceholderPrefix: "agenthold"})
	require.NoError(t, err)
	header := "" // a rule that only replaces sets no header
	if len(places) == 0 {
		header = "X-Bot-Token"
	}
	require.NoError(t, v.Set(Secret{Name: "bot", Rule: Rule{Hosts: []string{"api.telegram.test"}, Header: header, ReplaceIn: places, BodyTypes: bodyTypes}}, []byte("123456:REAL-bot-token/with+chars")))
	a, err := v.Attach("a1", "bot", "BOT_TOKEN")
	require.NoError(t, err)
	return v, a.Placeholder
}

func bodyRequest(t *testing.T, target, contentType, body string, length int64) *http.Request {
	r, err := http.NewRequest("POST", target, io.NopCloser(strings.NewReader(body)))
	require.NoError(t, err)
	r.Header.Set("Content-Type", contentType)
	r.ContentLength = length
	return r
}

func TestSubstitution(t *testing.T) {
	const value = "123456:REAL-bot-token/with+chars"
	t.Run("path", func(t *testing.T) {
		v, ph := substVault(t, []string{InPath}, nil)
		r := newRequest(t, "https://api.telegram.test/bot"+ph+"/sendMessage", nil)
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		assert.Equal(t, "/bot"+value+"/sendMessage", r.URL.Path)
		assert.Len(t, r.Header, 0, "a rule that only replaces set a header")
		assert.Contains(t, r.URL.EscapedPath(), "REAL-bot-token%2Fwith+chars", "the value's slash must stay inside its segment")
	})
	t.Run("body of a listed type, its length corrected", func(t *testing.T) {
		v, ph := substVault(t, []string{InBody}, []string{"application/json"})
		body := `{"token":"` + ph + `","again":"` + ph + `"}`
		r := bodyRequest(t, "https://api.telegram.test/x", "application/json; charset=utf-8", body, int64(len(body)))
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		got, _ := io.ReadAll(r.Body)
		assert.Equal(t, strings.ReplaceAll(body, ph, value), string(got))
		assert.Equal(t, int64(len(got)), r.ContentLength)
		again, err := r.GetBody()
		require.NoError(t, err)
		b, _ := io.ReadAll(again)
		assert.Equal(t, got, b, "GetBody gives the replaced body")
	})
	t.Run("a streamed body", func(t *testing.T) {
		v, ph := substVault(t, []string{InBody}, []string{"text/plain"})
		body := strings.Repeat("x", 70000) + ph + strings.Repeat("y", 70000)
		r := bodyRequest(t, "https://api.telegram.test/x", "text/plain", body, -1)
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		got, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		assert.Equal(t, strings.ReplaceAll(body, ph, value), string(got))
	})
	t.Run("a streamed body past the bound", func(t *testing.T) {
		v, _ := substVault(t, []string{InBody}, []string{"text/plain"})
		r := bodyRequest(t, "https://api.telegram.test/x", "text/plain", strings.Repeat("z", MaxBufferedBody+100), -1)
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		_, err = io.ReadAll(r.Body)
		assert.ErrorIs(t, err, errBodyTooLong)
	})
	t.Run("a body of known length past the bound is refused", func(t *testing.T) {
		v, _ := substVault(t, []string{InBody}, []string{"text/plain"})
		r := bodyRequest(t, "https://api.telegram.test/x", "text/plain", "", MaxBufferedBody+1)
		_, err := v.Inject("a1", r)
		var refused *RefusedError
		assert.ErrorAs(t, err, &refused)
	})
	t.Run("off unless listed", func(t *testing.T) {
		v, ph := substVault(t, nil, nil)
		body := `{"token":"` + ph + `"}`
		r := bodyRequest(t, "https://api.telegram.test/bot"+ph+"/x", "application/json", body, int64(len(body)))
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		got, _ := io.ReadAll(r.Body)
		assert.Equal(t, body, string(got), "the body was replaced in by default")
		assert.Contains(t, r.URL.Path, ph, "the path was replaced in by default")
	})
	t.Run("another media type, or another host", func(t *testing.T) {
		v, ph := substVault(t, []string{InBody, InPath}, []string{"application/json"})
		body := "token=" + ph
		r := bodyRequest(t, "https://api.telegram.test/x", "application/x-www-form-urlencoded", body, int64(len(body)))
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		got, _ := io.ReadAll(r.Body)
		assert.Equal(t, body, string(got), "a type the rule does not list was replaced in")
		other := bodyRequest(t, "https://evil.test/bot"+ph, "application/json", `"`+ph+`"`, int64(len(ph)+2))
		_, err = v.Inject("a1", other)
		require.NoError(t, err)
		b, _ := io.ReadAll(other.Body)
		assert.False(t, bytes.Contains(b, []byte(value)), "the value went to another host")
		assert.Contains(t, other.URL.Path, ph)
	})
	t.Run("rule checks", func(t *testing.T) {
		v, _ := newVault(t)
		for _, r := range []Rule{
			{Hosts: []string{"h.test"}, Header: "X", ReplaceIn: []string{InBody}},
			{Hosts: []string{"h.test"}, Header: "X", BodyTypes: []string{"application/json"}},
			{Hosts: []string{"h.test"}, Header: "X", ReplaceIn: []string{InBody}, BodyTypes: []string{"application/json; charset=utf-8"}},
			{Hosts: []string{"h.test"}, Header: "X", ReplaceIn: []string{"cookie-jar"}},
			{Hosts: []string{"h.test"}, ReplaceIn: []string{InRuleHeader}},
			{Hosts: []string{"h.test"}},
		} {
			assert.Error(t, v.Set(Secret{Name: "s", Rule: r}, []byte("v")), "%+v", r)
		}
	})
	t.Run("an echo of what was replaced is redacted", func(t *testing.T) {
		v, ph := substVault(t, []string{InPath, InBody}, []string{"application/json"})
		red, err := v.Redactor("a1", "api.telegram.test")
		require.NoError(t, err)
		for _, echo := range []string{"/bot" + value + "/x", "/bot123456:REAL-bot-token%2Fwith+chars/x", `{"t":"` + value + `"}`} {
			out := red.String(echo)
			assert.Contains(t, out, ph, echo)
			assert.NotContains(t, out, "REAL-bot-token", echo)
		}
	})
}
