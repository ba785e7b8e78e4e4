package vault

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/agenthold/egress/internal/redact"
)

// takesBody reports whether r's body is of a media type the rule replaces
// in.
func (c *compiledRule) takesBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return false
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && slices.Contains(c.BodyTypes, mt)
}

// replacePath replaces placeholder with value in u's path, escaped as
// one segment's bytes: a "/" in the value stays inside its segment.
func replacePath(u *url.URL, placeholder, value string) {
	raw := strings.ReplaceAll(u.EscapedPath(), placeholder, url.PathEscape(value))
	u.Path = strings.ReplaceAll(u.Path, placeholder, value)
	u.RawPath = raw
}

// replaceBody replaces placeholder with value in r's body: read whole and
// sent with its corrected Content-Length when its length is known (at
// most MaxBufferedBody, and as long once replaced), replaced as it streams
// when it is not (and cut off past MaxBufferedBody).
func (v *Vault) replaceBody(agent string, r *http.Request, placeholder, value string) error {
	if r.ContentLength < 0 {
		rep := redact.New([]redact.Pair{{Find: placeholder, Replace: value}})
		r.Body = &boundedBody{r: rep.Reader(r.Body), c: r.Body, left: MaxBufferedBody}
		r.GetBody = nil
		return nil
	}
	b, err := v.readBody(agent, r, MaxBufferedBody, "to replace a placeholder in")
	if err != nil || b == nil {
		return err
	}
	replaced := bytes.ReplaceAll(b, []byte(placeholder), []byte(value))
	if len(replaced) > MaxBufferedBody {
		r.Body.Close() // gives the buffer back
		return &RefusedError{Reason: fmt.Sprintf("a body that replacing its placeholders makes longer than %d bytes", MaxBufferedBody)}
	}
	rb := r.Body.(*releasingBody)
	setBody(r, replaced, rb.release)
	return nil
}

// errBodyTooLong ends a streamed body past MaxBufferedBody.
var errBodyTooLong = errors.New("vault: a streamed body to replace in is longer than the gateway replaces in")

// boundedBody is a replaced stream that fails past its bound.
type boundedBody struct {
	r    io.Reader
	c    io.Closer
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.r.Read(one[:]); n == 0 && err == io.EOF {
			return 0, io.EOF // it ended right at the bound
		}
		return 0, errBodyTooLong
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *boundedBody) Close() error { return b.c.Close() }

// WebSocketSubstitution returns the replacer that puts an agent's secrets
// in place of their placeholders in the WebSocket text messages it sends
// to host, for the inject rules that name host and list InWebSocket; nil
// when there are none. mitm applies it to the client's messages.
func (v *Vault) WebSocketSubstitution(agent, host string) (*redact.Replacer, error) {
	h, err := normalizeHost(host)
	if err != nil {
		return nil, nil // no rule names an invalid host
	}
	cur := v.cur.Load()
	var pairs []redact.Pair
	for _, a := range cur.attach[agent] {
		e := cur.secrets[a.Secret]
		if e == nil || e.rule.Mode != Inject || !e.rule.inWebSocket || !e.rule.coversHost(h) {
			continue
		}
		value, _, err := v.valueOf(cur.key, e)
		if err != nil {
			return nil, fmt.Errorf("vault: secret %q: %w", a.Secret, err)
		}
		pairs = append(pairs, redact.Pair{Find: a.Placeholder, Replace: string(value)})
		clear(value)
	}
	if len(pairs) == 0 {
		return nil, nil
	}
	return redact.New(pairs), nil
}
