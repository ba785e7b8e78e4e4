package testkit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// VerifySigV4 checks, as an AWS service would, that r (received by a
// server, with body read into body) is signed with creds: in its
// Authorization header or presigned query, over the headers it names, at
// a time within 15 minutes of now (or, presigned, before it expires). It
// recomputes the signature with the SDK's signer.
func VerifySigV4(r *http.Request, body []byte, creds aws.Credentials, now time.Time) error {
	q := r.URL.Query()
	presigned := q.Has("X-Amz-Signature")
	var credential, signedHeaders, signature, date string
	if presigned {
		credential, signedHeaders, signature, date = q.Get("X-Amz-Credential"), q.Get("X-Amz-SignedHeaders"), q.Get("X-Amz-Signature"), q.Get("X-Amz-Date")
	} else {
		alg, params, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if alg != "AWS4-HMAC-SHA256" {
			return fmt.Errorf("not SigV4: %q", alg)
		}
		fields := map[string]string{}
		for f := range strings.SplitSeq(params, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
			fields[k] = v
		}
		credential, signedHeaders, signature, date = fields["Credential"], fields["SignedHeaders"], fields["Signature"], r.Header.Get("X-Amz-Date")
	}
	scope := strings.Split(credential, "/")
	if len(scope) != 5 || scope[0] != creds.AccessKeyID {
		return fmt.Errorf("signed with another key: credential %q", credential)
	}
	t, err := time.Parse("20060102T150405Z", date)
	if err != nil {
		return fmt.Errorf("signing time %q: %w", date, err)
	}
	if presigned {
		expires, _ := strconv.Atoi(q.Get("X-Amz-Expires"))
		if now.After(t.Add(time.Duration(expires) * time.Second)) {
			return errors.New("presigned URL expired")
		}
	} else if d := now.Sub(t); d > 15*time.Minute || d < -15*time.Minute {
		return fmt.Errorf("signing time %v is %v away", t, d)
	}
	if creds.SessionToken != "" && r.Header.Get("X-Amz-Security-Token") != creds.SessionToken && q.Get("X-Amz-Security-Token") != creds.SessionToken {
		return errors.New("session token missing or wrong")
	}

	clone := &http.Request{Method: r.Method, URL: &url.URL{Scheme: "https", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath}, Host: r.Host, Header: http.Header{}}
	for _, h := range strings.Split(signedHeaders, ";") {
		switch h {
		case "host", "authorization", "x-amz-date", "x-amz-security-token":
		case "content-length":
			clone.ContentLength = r.ContentLength
		default:
			clone.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	s3 := strings.HasPrefix(scope[3], "s3")
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = s3; o.DisableHeaderHoisting = true })
	var want, wantHeaders string
	if presigned {
		for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Security-Token"} {
			q.Del(k)
		}
		clone.URL.RawQuery = q.Encode()
		payload := "UNSIGNED-PAYLOAD"
		if !s3 {
			payload = hex.EncodeToString(sha256.New().Sum(nil))
		}
		signed, _, err := signer.PresignHTTP(context.Background(), creds, clone, payload, scope[3], scope[2], t)
		if err != nil {
			return err
		}
		u, _ := url.Parse(signed)
		want, wantHeaders = u.Query().Get("X-Amz-Signature"), u.Query().Get("X-Amz-SignedHeaders")
	} else {
		clone.URL.RawQuery = r.URL.RawQuery
		payload := r.Header.Get("X-Amz-Content-Sha256")
		if payload == "" {
			sum := sha256.Sum256(body)
			payload = hex.EncodeToString(sum[:])
		}
		if err := signer.SignHTTP(context.Background(), creds, clone, payload, scope[3], scope[2], t); err != nil {
			return err
		}
		_, params, _ := strings.Cut(clone.Header.Get("Authorization"), " ")
		for f := range strings.SplitSeq(params, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
			switch k {
			case "Signature":
				want = v
			case "SignedHeaders":
				wantHeaders = v
			}
		}
	}
	if wantHeaders != signedHeaders {
		return fmt.Errorf("signed headers %q, recomputed over %q", signedHeaders, wantHeaders)
	}
	if want != signature {
		return errors.New("signature does not match")
	}
	return nil
}
