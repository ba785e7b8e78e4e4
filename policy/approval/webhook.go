package approval

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries the signature of a webhook exchange's body,
// both ways: "t=UNIX,v1=HEX", HEX being HMAC-SHA256 with the shared
// secret over "DIRECTION.UNIX.BODY", so that neither side's message can
// be passed off as the other's.
const SignatureHeader = "Egress-Signature"

// The directions of a webhook exchange, which a signature covers.
const (
	Asking    = "request" // the gateway's request to the webhook
	Answering = "answer"  // the webhook's answer to the gateway
)

// DefaultMaxSkew bounds how old (or how far ahead) a signature's time may
// be.
const DefaultMaxSkew = 5 * time.Minute

// Webhook asks a control plane, a chat bot or a policy service about each
// new approval request: a POST of the Request as JSON, signed. Its
// answer, if it gives one at once, is a 200 whose body is
// {"id": ID, "answer": "once"|"session"|"always"|"deny"}, signed with the
// same secret, naming the request it answers; anything else (a 202, an
// error, a bad signature, another request's ID) leaves the request
// pending, for the admin API or the timeout.
type Webhook struct {
	URL    string
	Secret []byte
	Client *http.Client // nil means one with a 10 s timeout
	// MaxSkew bounds a signature's age; zero means DefaultMaxSkew.
	MaxSkew time.Duration
}

// Errors of Verify.
var (
	ErrBadSignature = errors.New("approval: webhook signature does not match")
	ErrStale        = errors.New("approval: webhook signature is too old or from the future")
)

// webhookAnswer is the body of a webhook's answer.
type webhookAnswer struct {
	ID     string `json:"id"`
	Answer Answer `json:"answer"`
}

// defaultClient follows no redirect: the request is for the URL given,
// and its signature for no one else.
var defaultClient = &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// post asks the webhook about req, and returns its answer, or "".
func (w *Webhook) post(ctx context.Context, req Request) (Answer, error) {
	if len(w.Secret) == 0 {
		return "", errors.New("no secret to sign with: the webhook is not asked")
	}
	body, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(SignatureHeader, Sign(w.Secret, Asking, body, time.Now()))
	c := w.Client
	if c == nil {
		c = defaultClient
	}
	resp, err := c.Do(hr)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", err // a 202 or an error: no answer now
	}
	if err := Verify(w.Secret, Answering, resp.Header.Get(SignatureHeader), answer, time.Now(), w.MaxSkew); err != nil {
		return "", fmt.Errorf("its answer: %w", err)
	}
	var a webhookAnswer
	if err := json.Unmarshal(answer, &a); err != nil {
		return "", fmt.Errorf("its answer: %w", err)
	}
	if a.ID != req.ID {
		return "", fmt.Errorf("its answer names request %q, not %q", a.ID, req.ID)
	}
	if _, err := ParseAnswer(string(a.Answer)); err != nil {
		return "", err
	}
	return a.Answer, nil
}

// Sign is the SignatureHeader value for body sent in direction (Asking,
// Answering) at t.
func Sign(secret []byte, direction string, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, direction, ts, body))
}

// Verify checks a SignatureHeader value for body sent in direction: the
// signature, and its
// time within maxSkew of now (zero means DefaultMaxSkew), so that a
// recorded exchange cannot be replayed later. A receiver of the webhook
// verifies the gateway's requests with it; the gateway, the answers.
func Verify(secret []byte, direction, header string, body []byte, now time.Time, maxSkew time.Duration) error {
	var ts, sig string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return ErrBadSignature
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(secret, direction, ts, body)) {
		return ErrBadSignature
	}
	skew := now.Sub(time.Unix(unix, 0))
	if skew < 0 {
		skew = -skew
	}
	if skew > orDefault(maxSkew, DefaultMaxSkew) {
		return ErrStale
	}
	return nil
}

func mac(secret []byte, direction, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(direction))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}
