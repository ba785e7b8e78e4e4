package vault

import (
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// What the AWS re-signer will not sign: a request that would hand the
// sandbox credentials of its own (whose values no redactor knows), and a
// signing time far from now (a presigned URL re-signed for a week).

// maxAWSClockSkew is how far a request's signing time may be from now,
// as AWS allows.
const maxAWSClockSkew = 15 * time.Minute

// MaxAWSPresignExpiry bounds the lifetime of a presigned URL the gateway
// re-signs.
const MaxAWSPresignExpiry = time.Hour

// badTime says why a signature's time is refused, or "".
func (s sigV4) badTime(r *http.Request, now time.Time) string {
	if !s.presigned {
		if d := now.Sub(s.date); d > maxAWSClockSkew || d < -maxAWSClockSkew {
			return "signed at " + s.dateRaw + ", more than 15 minutes from now"
		}
		return ""
	}
	expires, err := strconv.Atoi(r.URL.Query().Get("X-Amz-Expires"))
	switch {
	case err != nil || expires <= 0:
		return "a presigned URL without a valid X-Amz-Expires"
	case time.Duration(expires)*time.Second > MaxAWSPresignExpiry:
		return "a presigned URL valid for longer than an hour"
	case s.date.Sub(now) > maxAWSClockSkew:
		return "a presigned URL signed in the future"
	case now.After(s.date.Add(time.Duration(expires) * time.Second)):
		return "an expired presigned URL"
	}
	return ""
}

// formBody reports whether r's body is a form (the query protocol of
// STS, IAM and others).
func formBody(r *http.Request) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == "application/x-www-form-urlencoded"
}

// stsAllowed are the STS actions that return no credentials.
var stsAllowed = map[string]bool{"GetCallerIdentity": true, "GetAccessKeyInfo": true, "DecodeAuthorizationMessage": true}

// vendingActions are other services' query-protocol actions that return
// credentials or reset them.
var vendingActions = map[string]map[string]bool{
	"iam": {"CreateAccessKey": true, "UpdateAccessKey": true, "CreateServiceSpecificCredential": true, "ResetServiceSpecificCredential": true,
		"CreateLoginProfile": true, "UpdateLoginProfile": true, "ChangePassword": true},
	"redshift": {"GetClusterCredentials": true, "GetClusterCredentialsWithIAM": true},
}

// vendingTargets end the X-Amz-Target of JSON-protocol operations that
// return credentials or tokens that stand for them.
var vendingTargets = []string{".GetAuthorizationToken", ".GetCredentialsForIdentity", ".GetOpenIdToken", ".GetOpenIdTokenForDeveloperIdentity",
	".GetRoleCredentials", ".GetClusterCredentials", ".GetClusterCredentialsWithIAM", ".GetTemporaryGlueTableCredentials", ".GetCredentials"}

// vendsCredentials says why a request would get the sandbox credentials
// of its own (STS sessions and roles, IAM access keys, registry and
// repository tokens), or "". A known list: an operator should give the
// gateway keys whose policy grants nothing it must not hand out.
func vendsCredentials(s sigV4, r *http.Request, body []byte) string {
	refuse := func(what string) string {
		return "AWS " + s.service + " " + what + " would hand the sandbox credentials of its own: not re-signed"
	}
	// A query or form Go cannot read whole may still name an Action to
	// AWS (a ";" in a key, a bad escape: url.Values drops the pair, or all
	// of it): refused, not read as naming none.
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return refuse("request whose query cannot be read")
	}
	actions := query["Action"]
	if len(body) > 0 && formBody(r) {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return refuse("request whose form cannot be read")
		}
		actions = append(actions, form["Action"]...)
	}
	for _, a := range actions {
		switch {
		case s.service == "sts" && !stsAllowed[a]:
			return refuse(a)
		case vendingActions[s.service][a]:
			return refuse(a)
		}
	}
	if s.service == "sts" && len(actions) == 0 {
		return refuse("request without an Action")
	}
	target := r.Header.Get("X-Amz-Target")
	for _, t := range vendingTargets {
		if strings.HasSuffix(target, t) {
			return refuse(target)
		}
	}
	switch {
	case s.service == "codeartifact" && strings.HasSuffix(r.URL.Path, "/authorization-token"),
		strings.HasSuffix(r.URL.Path, "/federation/credentials"):
		return refuse(r.URL.Path)
	}
	return ""
}
