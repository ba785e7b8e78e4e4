package vault

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// An AWSSigV4 secret's value is "ACCESS_KEY_ID:SECRET_ACCESS_KEY", or
// "ACCESS_KEY_ID:SECRET_ACCESS_KEY:SESSION_TOKEN" for temporary
// credentials. The sandbox is given the attachment's placeholder as its
// access key ID and its secret key (and session token, if the real
// credentials have one), signs with them as any SDK does, and the gateway
// re-signs each request it finds signed with the placeholder.

// AWSCredentials are the parts of an AWSSigV4 secret's value.
type AWSCredentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// SigV4 says how to sign one request with AWS Signature Version 4.
type SigV4 struct {
	Credentials     AWSCredentials
	PayloadHash     string
	Service, Region string
	Time            time.Time
	PathAsSent      bool // sign the path as sent, not escaped again (S3)
}

// SigV4Signer signs requests for the AWSSigV4 mode: Sign sets r's
// Authorization and X-Amz-Date headers over the headers r carries;
// Presign returns r's URL presigned. Package vault/awssig gives the one
// built on AWS's own signer, apart so that no other user of vault links
// the AWS SDK; a vault without one (Config.SigV4) refuses to inject
// AWSSigV4 secrets.
type SigV4Signer interface {
	Sign(ctx context.Context, r *http.Request, s SigV4) error
	Presign(ctx context.Context, r *http.Request, s SigV4) (string, error)
}

// ErrNoSigV4Signer refuses an AWSSigV4 secret's request in a vault with
// no SigV4Signer.
var ErrNoSigV4Signer = errors.New("vault: no SigV4 signer to re-sign AWS requests (Config.SigV4; package vault/awssig has one)")

// awsTimeFormat is SigV4's X-Amz-Date.
const awsTimeFormat = "20060102T150405Z"

// Payload hashes that are not a hash of the body.
const (
	awsUnsignedPayload = "UNSIGNED-PAYLOAD"
	// The signed-chunk encodings: each chunk's signature chains on the
	// secret key, so the gateway cannot re-sign them without rewriting
	// the stream; SDKs use them only over plain HTTP.
	awsSignedChunksPrefix = "STREAMING-AWS4-"
)

// parseAWSValue splits an AWSSigV4 secret's value.
func parseAWSValue(value string) (AWSCredentials, error) {
	parts := strings.Split(value, ":")
	if len(parts) != 2 && len(parts) != 3 {
		return AWSCredentials{}, errors.New("an aws-sigv4 secret is ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]")
	}
	for _, p := range parts {
		if p == "" || strings.ContainsAny(p, " \t\r\n") {
			return AWSCredentials{}, errors.New("an aws-sigv4 secret's parts are non-empty and without spaces")
		}
	}
	if strings.Contains(parts[0], "/") {
		return AWSCredentials{}, errors.New("an aws-sigv4 secret's access key ID has no '/'")
	}
	c := AWSCredentials{AccessKeyID: parts[0], SecretAccessKey: parts[1]}
	if len(parts) == 3 {
		c.SessionToken = parts[2]
	}
	return c, nil
}

// sigV4 is what a request's SigV4 signature says of itself.
type sigV4 struct {
	presigned       bool
	accessKey       string
	region, service string
	signedHeaders   []string
	date            time.Time
	payloadHash     string // of a presigned request, if its query names one
	dateRaw         string
}

// parseSigV4 reads the signature of r: the Authorization header, or a
// presigned query. ok is false when r is not signed at all.
func parseSigV4(r *http.Request) (s sigV4, ok bool, err error) {
	q := r.URL.Query()
	auth := r.Header.Get("Authorization")
	switch {
	case auth != "" && q.Has("X-Amz-Credential"):
		return s, true, errors.New("signed twice, in the Authorization header and the query")
	case auth != "":
		alg, params, _ := strings.Cut(auth, " ")
		if alg != "AWS4-HMAC-SHA256" {
			return s, true, fmt.Errorf("signed with %q, not AWS4-HMAC-SHA256", alg)
		}
		fields := map[string]string{}
		for f := range strings.SplitSeq(params, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
			fields[k] = v
		}
		s.dateRaw = r.Header.Get("X-Amz-Date")
		err = s.fill(fields["Credential"], fields["SignedHeaders"])
		return s, true, err
	case q.Has("X-Amz-Credential") || q.Has("X-Amz-Signature"):
		if alg := q.Get("X-Amz-Algorithm"); alg != "AWS4-HMAC-SHA256" {
			return s, true, fmt.Errorf("presigned with %q, not AWS4-HMAC-SHA256", alg)
		}
		s.presigned = true
		s.dateRaw = q.Get("X-Amz-Date")
		s.payloadHash = q.Get("X-Amz-Content-Sha256")
		err = s.fill(q.Get("X-Amz-Credential"), q.Get("X-Amz-SignedHeaders"))
		return s, true, err
	}
	return s, false, nil
}

// fill reads the credential scope (KEY/DATE/REGION/SERVICE/aws4_request),
// the signed headers and the signing time.
func (s *sigV4) fill(credential, signedHeaders string) error {
	parts := strings.Split(credential, "/")
	if len(parts) != 5 || parts[4] != "aws4_request" || parts[0] == "" || parts[2] == "" || parts[3] == "" {
		return errors.New("the SigV4 credential scope is malformed")
	}
	s.accessKey, s.region, s.service = parts[0], parts[2], parts[3]
	if signedHeaders == "" {
		return errors.New("the SigV4 signature names no signed headers")
	}
	s.signedHeaders = strings.Split(strings.ToLower(signedHeaders), ";") // not a name: header names
	t, err := time.Parse(awsTimeFormat, s.dateRaw)
	if err != nil || t.Format("20060102") != parts[1] {
		return errors.New("the SigV4 signing time is missing or disagrees with the credential scope")
	}
	s.date = t
	return nil
}

// resignAWS re-signs r, found signed with placeholder as its access key
// ID, with creds: its Authorization header (or presigned query), X-Amz-Date
// and X-Amz-Security-Token are replaced, over the same signed headers and
// signing time. A request not signed at all is left alone; one signed
// otherwise, or in a way the gateway cannot re-sign, is refused.
func (v *Vault) resignAWS(agent string, r *http.Request, placeholder string, creds AWSCredentials) (bool, error) {
	signer := v.cfg.SigV4
	sig, signed, err := parseSigV4(r)
	switch {
	case !signed:
		return false, nil
	case err != nil:
		return false, &RefusedError{Reason: "AWS request: " + err.Error()}
	case sig.accessKey != placeholder:
		return false, &RefusedError{Reason: "AWS request signed with an access key ID that is not the agent's placeholder"}
	case signer == nil:
		return false, ErrNoSigV4Signer
	}
	if why := sig.badTime(r, v.now()); why != "" {
		return false, &RefusedError{Reason: "AWS request: " + why}
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	var body []byte
	if formBody(r) || (!sig.presigned && payload == "") {
		// Hashed here when the client did not say; read anyway when it is
		// a form, presigned or not, whose Action may ask for credentials.
		if body, err = v.readBody(agent, r, MaxBufferedBody, "to re-sign an AWS request"); err != nil {
			return false, err
		}
	}
	if why := vendsCredentials(sig, r, body); why != "" {
		return false, &RefusedError{Reason: why}
	}
	clone := &http.Request{Method: r.Method, URL: new(url.URL), Host: r.Host, Header: http.Header{}, ContentLength: r.ContentLength}
	*clone.URL = *r.URL
	for _, h := range sig.signedHeaders {
		switch h {
		case "host", "content-length", "authorization", "x-amz-date", "x-amz-security-token":
			continue // the signer sets its own
		}
		if vals := r.Header.Values(h); len(vals) > 0 {
			clone.Header[http.CanonicalHeaderKey(h)] = vals
		}
	}
	s3 := strings.HasPrefix(sig.service, "s3") // S3 signs the path as sent
	if sig.presigned {
		return true, presignAgain(r, clone, signer, sig, creds, s3)
	}
	switch {
	case strings.HasPrefix(payload, awsSignedChunksPrefix):
		return false, &RefusedError{Reason: "AWS request with signed chunks (" + payload + "): the gateway re-signs unsigned-payload streaming only"}
	case payload == "":
		sum := sha256.Sum256(body)
		payload = hex.EncodeToString(sum[:])
		clone.ContentLength = r.ContentLength
	}
	if err := signer.Sign(r.Context(), clone, SigV4{Credentials: creds, PayloadHash: payload, Service: sig.service, Region: sig.region, Time: sig.date, PathAsSent: s3}); err != nil {
		return false, fmt.Errorf("vault: re-signing an AWS request: %w", err)
	}
	r.Header.Set("Authorization", clone.Header.Get("Authorization"))
	r.Header.Set("X-Amz-Date", clone.Header.Get("X-Amz-Date"))
	setSessionToken(r.Header, creds)
	return true, nil
}

// presignAgain replaces the presigned query of r with one signed by
// creds, keeping its signing time and expiry.
func presignAgain(r, clone *http.Request, signer SigV4Signer, sig sigV4, creds AWSCredentials, s3 bool) error {
	q := clone.URL.Query()
	for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token"} {
		q.Del(k)
	}
	clone.URL.RawQuery = q.Encode()
	payload := sig.payloadHash
	switch {
	case payload != "":
	case s3:
		payload = awsUnsignedPayload
	default:
		payload = hex.EncodeToString(sha256.New().Sum(nil)) // an empty body
	}
	signedURL, err := signer.Presign(r.Context(), clone, SigV4{Credentials: creds, PayloadHash: payload, Service: sig.service, Region: sig.region, Time: sig.date, PathAsSent: s3})
	if err != nil {
		return fmt.Errorf("vault: re-signing a presigned AWS request: %w", err)
	}
	u, err := url.Parse(signedURL)
	if err != nil {
		return fmt.Errorf("vault: re-signing a presigned AWS request: %w", err)
	}
	r.URL.RawQuery = u.RawQuery
	r.Header.Del("X-Amz-Security-Token")
	return nil
}

// setSessionToken sends the real credentials' session token, or none: a
// placeholder token the sandbox sent never leaves.
func setSessionToken(h http.Header, creds AWSCredentials) {
	if creds.SessionToken != "" {
		h.Set("X-Amz-Security-Token", creds.SessionToken)
	} else {
		h.Del("X-Amz-Security-Token")
	}
}

// resignAWSWith is resignAWS with the secret's stored value.
func (v *Vault) resignAWSWith(agent string, r *http.Request, placeholder, value string) (bool, error) {
	creds, err := parseAWSValue(value)
	if err != nil {
		return false, fmt.Errorf("vault: %w", err)
	}
	return v.resignAWS(agent, r, placeholder, creds)
}
