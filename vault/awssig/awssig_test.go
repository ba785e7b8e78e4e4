package awssig_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/vault"
	"github.com/agenthold/egress/vault/awssig"
)

var realAWS = aws.Credentials{AccessKeyID: "AKIAREALKEYID0000001", SecretAccessKey: "real/secret+access+key+0000000000000000", SessionToken: "real-session-token-FwoGZXIvYXdzEJr"}

// awsVault holds an aws-sigv4 secret for *.amazonaws.com attached to a1,
// and returns a1's placeholder.
func awsVault(t testing.TB, creds aws.Credentials) (*vault.Vault, string) {
	v, err := vault.Open(&vault.MemoryStorage{}, bytes.Repeat([]byte{1}, vault.KeySize), vault.Config{PlaceholderPrefix: "agenthold", SigV4: awssig.Signer{}})
	require.NoError(t, err)
	value := creds.AccessKeyID + ":" + creds.SecretAccessKey
	if creds.SessionToken != "" {
		value += ":" + creds.SessionToken
	}
	require.NoError(t, v.Set(vault.Secret{Name: "aws", Rule: vault.Rule{Hosts: []string{"*.amazonaws.com"}, Mode: vault.AWSSigV4}}, []byte(value)))
	a, err := v.Attach("a1", "aws", "AWS_ACCESS_KEY_ID")
	require.NoError(t, err)
	return v, a.Placeholder
}

// sandboxSigned is a request signed as an SDK in the sandbox signs it:
// with the placeholder as key ID, secret key and session token.
func sandboxSigned(t testing.TB, ph, method, rawURL string, body []byte, header http.Header, service string) *http.Request {
	r, err := http.NewRequest(method, rawURL, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		r.Header[k] = v
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	if payload == "" {
		sum := sha256.Sum256(body)
		payload = hex.EncodeToString(sum[:])
	}
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = service == "s3" })
	fake := aws.Credentials{AccessKeyID: ph, SecretAccessKey: ph, SessionToken: ph}
	require.NoError(t, signer.SignHTTP(context.Background(), fake, r, payload, service, "us-east-1", time.Now()))
	return r
}

// request is a GET of rawURL with header, as the gateway hands it to
// Inject.
func request(t testing.TB, rawURL string, header http.Header) *http.Request {
	r, err := http.NewRequest("GET", rawURL, nil)
	require.NoError(t, err)
	for k, v := range header {
		r.Header[k] = v
	}
	return r
}

// received is the request as the upstream would read it.
func received(t *testing.T, r *http.Request) []byte {
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(r.Body)
		require.NoError(t, err)
	}
	return body
}

func TestAWSResign(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	t.Run("S3 PUT, unsigned streaming payload", func(t *testing.T) {
		r := sandboxSigned(t, ph, "PUT", "https://bucket.s3.us-east-1.amazonaws.com/dir/a%20b.txt", []byte("hello"),
			http.Header{"X-Amz-Content-Sha256": {"STREAMING-UNSIGNED-PAYLOAD-TRAILER"}, "Content-Encoding": {"aws-chunked"}}, "s3")
		require.Error(t, testkit.VerifySigV4(r, nil, realAWS, time.Now()), "the verifier accepts the placeholder's signature")
		used, err := v.Inject("a1", r)
		require.NoError(t, err)
		assert.Equal(t, []string{"aws"}, used)
		assert.NoError(t, testkit.VerifySigV4(r, received(t, r), realAWS, time.Now()))
		assert.Equal(t, realAWS.SessionToken, r.Header.Get("X-Amz-Security-Token"), "the placeholder token went out")
	})
	t.Run("STS POST, body hashed at the gateway", func(t *testing.T) {
		body := []byte("Action=GetCallerIdentity&Version=2011-06-15")
		r := sandboxSigned(t, ph, "POST", "https://sts.us-east-1.amazonaws.com/", body, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "sts")
		_, err := v.Inject("a1", r)
		require.NoError(t, err)
		body = received(t, r)
		assert.NoError(t, testkit.VerifySigV4(r, body, realAWS, time.Now()))
		assert.Error(t, testkit.VerifySigV4(r, append(body, '!'), realAWS, time.Now()), "the verifier ignores the body")
	})
	t.Run("presigned GET", func(t *testing.T) {
		r, _ := http.NewRequest("GET", "https://bucket.s3.us-east-1.amazonaws.com/key.txt?X-Amz-Expires=300", nil)
		fake := aws.Credentials{AccessKeyID: ph, SecretAccessKey: ph}
		signed, _, err := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }).PresignHTTP(context.Background(), fake, r, "UNSIGNED-PAYLOAD", "s3", "us-east-1", time.Now())
		require.NoError(t, err)
		r = request(t, signed, nil)
		_, err = v.Inject("a1", r)
		require.NoError(t, err)
		assert.NoError(t, testkit.VerifySigV4(r, nil, realAWS, time.Now()))
		assert.Equal(t, "300", r.URL.Query().Get("X-Amz-Expires"), "the expiry changed")
		assert.NotContains(t, r.URL.RawQuery, ph, "the placeholder went out")
	})
	t.Run("an unsigned request is left alone", func(t *testing.T) {
		r := request(t, "https://public.s3.amazonaws.com/object", nil)
		used, err := v.Inject("a1", r)
		require.NoError(t, err)
		assert.Empty(t, used)
		assert.Empty(t, r.Header.Get("Authorization"))
	})
	t.Run("another host is not re-signed", func(t *testing.T) {
		r := sandboxSigned(t, ph, "GET", "https://minio.example.com/bucket/key", nil, nil, "s3")
		before := r.Header.Get("Authorization")
		used, err := v.Inject("a1", r)
		require.NoError(t, err)
		assert.Empty(t, used)
		assert.Equal(t, before, r.Header.Get("Authorization"))
	})
}

// TestAWSRefusals: what the gateway will not re-sign, each refused with
// a reason, none forwarded with the real key.
func TestAWSRefusals(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	other := sandboxSigned(t, "AKIAOTHERKEY", "GET", "https://s3.amazonaws.com/", nil, nil, "s3")
	chunks := sandboxSigned(t, ph, "PUT", "https://bucket.s3.amazonaws.com/k", nil, http.Header{"X-Amz-Content-Sha256": {"STREAMING-AWS4-HMAC-SHA256-PAYLOAD"}}, "s3")
	sigv4a := request(t, "https://s3.amazonaws.com/", http.Header{"Authorization": {"AWS4-ECDSA-P256-SHA256 Credential=" + ph + "/20261201/s3/aws4_request, SignedHeaders=host, Signature=00"}, "X-Amz-Date": {"20261201T000000Z"}})
	sigv2 := request(t, "https://s3.amazonaws.com/", http.Header{"Authorization": {"AWS " + ph + ":c2lnbmF0dXJl"}})
	badScope := request(t, "https://s3.amazonaws.com/", http.Header{"Authorization": {"AWS4-HMAC-SHA256 Credential=" + ph + "/20261201/us-east-1/s3, SignedHeaders=host, Signature=00"}, "X-Amz-Date": {"20261201T000000Z"}})
	badDate := request(t, "https://s3.amazonaws.com/", http.Header{"Authorization": {"AWS4-HMAC-SHA256 Credential=" + ph + "/20261130/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00"}, "X-Amz-Date": {"20261201T000000Z"}})
	twice := sandboxSigned(t, ph, "GET", "https://s3.amazonaws.com/?X-Amz-Credential=x", nil, nil, "s3")
	big := sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", bytes.Repeat([]byte("a"), vault.MaxBufferedBody+1), nil, "sts")
	big.Header.Del("X-Amz-Content-Sha256")
	for name, r := range map[string]*http.Request{
		"signed with another key": other, "signed chunks": chunks, "SigV4a": sigv4a, "SigV2": sigv2,
		"malformed scope": badScope, "scope date disagrees": badDate, "signed twice": twice, "body over the bound": big,
	} {
		_, err := v.Inject("a1", r)
		var refused *vault.RefusedError
		if assert.ErrorAs(t, err, &refused, name) {
			assert.NotContains(t, refused.Reason, realAWS.AccessKeyID, name)
		}
		assert.NotContains(t, r.Header.Get("Authorization"), realAWS.AccessKeyID, "%s: signed with the real key anyway", name)
	}
}

func TestAWSSecretValue(t *testing.T) {
	v, err := vault.Open(&vault.MemoryStorage{}, bytes.Repeat([]byte{1}, vault.KeySize), vault.Config{})
	require.NoError(t, err)
	rule := vault.Rule{Hosts: []string{"*.amazonaws.com"}, Mode: vault.AWSSigV4}
	for _, bad := range []string{"onlyone", "a:b:c:d", "a::c", "AKIA/X:secret", "a:b c"} {
		assert.Error(t, v.Set(vault.Secret{Name: "aws", Rule: rule}, []byte(bad)), "value %q", bad)
	}
	assert.NoError(t, v.Set(vault.Secret{Name: "aws", Rule: rule}, []byte("AKIA:se/cr+et")))
	assert.Error(t, v.Set(vault.Secret{Name: "aws2", Rule: vault.Rule{Hosts: rule.Hosts, Mode: vault.AWSSigV4, Header: "X-Key"}}, []byte("AKIA:secret")), "a header on an aws-sigv4 rule")
}

// TestAWSRedaction: an upstream that quotes the real key ID, secret or
// token (as AWS errors quote the key ID) shows the sandbox its
// placeholder.
func TestAWSRedaction(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	red, err := v.Redactor("a1", "s3.amazonaws.com")
	require.NoError(t, err)
	require.NotNil(t, red)
	for _, leak := range []string{realAWS.AccessKeyID, realAWS.SecretAccessKey, realAWS.SessionToken, url.QueryEscape(realAWS.SecretAccessKey)} {
		out := red.String("<Error><AWSAccessKeyId>" + leak + "</AWSAccessKeyId></Error>")
		assert.NotContains(t, out, leak)
		assert.Contains(t, out, ph)
	}
}

// BenchmarkAWSResign measures re-signing an S3 request (headers only;
// its payload hash is the client's).
func BenchmarkAWSResign(b *testing.B) {
	v, ph := awsVault(b, realAWS)
	orig := sandboxSigned(b, ph, "GET", "https://bucket.s3.us-east-1.amazonaws.com/key?list-type=2", nil,
		http.Header{"X-Amz-Content-Sha256": {"UNSIGNED-PAYLOAD"}, "Accept": {"*/*"}}, "s3")
	b.ReportAllocs()
	for b.Loop() {
		r := orig.Clone(context.Background())
		if _, err := v.Inject("a1", r); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAWSEnvironment(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	assert.ElementsMatch(t, []string{"AWS_ACCESS_KEY_ID=" + ph, "AWS_SECRET_ACCESS_KEY=" + ph, "AWS_SESSION_TOKEN=" + ph}, v.Environment("a1"))
	assert.Empty(t, v.Environment("a2"))
}

// TestAWSNoCredentialsForTheSandbox: a request that would hand the
// sandbox credentials of its own is not re-signed, whichever protocol
// asks; GetCallerIdentity still is.
func TestAWSNoCredentialsForTheSandbox(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded; charset=utf-8"}}
	for name, r := range map[string]*http.Request{
		"STS GetSessionToken": sandboxSigned(t, ph, "POST", "https://sts.us-east-1.amazonaws.com/", []byte("Action=GetSessionToken&Version=2011-06-15&DurationSeconds=129600"), form, "sts"),
		"STS AssumeRole":      sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", []byte("Action=AssumeRole&RoleArn=arn:aws:iam::1:role/x&RoleSessionName=s"), form, "sts"),
		"STS, in the query":   sandboxSigned(t, ph, "GET", "https://sts.amazonaws.com/?Action=GetFederationToken&Name=x", nil, nil, "sts"),
		"STS, no action":      sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", nil, nil, "sts"),
		"STS, a hashed form": sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", []byte("Action=GetSessionToken"),
			http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "X-Amz-Content-Sha256": {"UNSIGNED-PAYLOAD"}}, "sts"),
		"IAM CreateAccessKey":       sandboxSigned(t, ph, "POST", "https://iam.amazonaws.com/", []byte("Action=CreateAccessKey&UserName=me"), form, "iam"),
		"ECR GetAuthorizationToken": sandboxSigned(t, ph, "POST", "https://api.ecr.us-east-1.amazonaws.com/", []byte("{}"), http.Header{"X-Amz-Target": {"AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"}, "Content-Type": {"application/x-amz-json-1.1"}}, "ecr"),
		"CodeArtifact token":        sandboxSigned(t, ph, "POST", "https://codeartifact.us-east-1.amazonaws.com/v1/authorization-token?domain=d", nil, nil, "codeartifact"),
		// A query or form Go cannot read whole still names its Action to
		// AWS.
		"IAM, a ';' in the form":         sandboxSigned(t, ph, "POST", "https://iam.amazonaws.com/", []byte("Action=CreateAccessKey&UserName=me&a;b=1"), form, "iam"),
		"IAM, a bad escape":              sandboxSigned(t, ph, "POST", "https://iam.amazonaws.com/", []byte("Action=CreateAccessKey&UserName=me&x=%zz"), form, "iam"),
		"IAM, a ';' in the query":        sandboxSigned(t, ph, "GET", "https://iam.amazonaws.com/?Action=CreateAccessKey&UserName=me&a;b=1", nil, nil, "iam"),
		"STS, the query one thing":       sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/?Action=GetCallerIdentity", []byte("Action=AssumeRole&RoleArn=arn:aws:iam::1:role/x&RoleSessionName=s&a;b=1"), form, "sts"),
		"IAM CreateAccessKey, presigned": presignedForm(t, ph, "https://iam.amazonaws.com/", []byte("Action=CreateAccessKey&UserName=me"), "iam"),
	} {
		_, err := v.Inject("a1", r)
		var refused *vault.RefusedError
		if assert.ErrorAs(t, err, &refused, name) {
			assert.Contains(t, refused.Reason, "credentials of its own", name)
		}
		assert.NotContains(t, r.Header.Get("Authorization"), realAWS.AccessKeyID, "%s: signed anyway", name)
	}
	ok := sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", []byte("Action=GetCallerIdentity&Version=2011-06-15"), form, "sts")
	_, err := v.Inject("a1", ok)
	assert.NoError(t, err, "GetCallerIdentity refused")
}

// presignedForm is a form POST to rawURL presigned (its signature in the
// query) by the sandbox with its placeholder as the key ID.
func presignedForm(t testing.TB, ph, rawURL string, body []byte, service string) *http.Request {
	t.Helper()
	sum := sha256.Sum256(body)
	payload := hex.EncodeToString(sum[:])
	r, err := http.NewRequest("POST", rawURL+"?X-Amz-Expires=300", bytes.NewReader(body))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	signed, _, err := v4.NewSigner().PresignHTTP(context.Background(), aws.Credentials{AccessKeyID: ph, SecretAccessKey: ph}, r, payload, service, "us-east-1", time.Now())
	require.NoError(t, err)
	u, err := url.Parse(signed)
	require.NoError(t, err)
	r.URL = u
	return r
}

// TestAWSSigningTime: a signature far from now, or a presigned URL for
// longer than an hour, is not re-signed.
func TestAWSSigningTime(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	old := sandboxSigned(t, ph, "GET", "https://s3.amazonaws.com/b/k", nil, http.Header{"X-Amz-Content-Sha256": {"UNSIGNED-PAYLOAD"}}, "s3")
	fake := aws.Credentials{AccessKeyID: ph, SecretAccessKey: ph}
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	old.Header.Del("Authorization")
	require.NoError(t, signer.SignHTTP(context.Background(), fake, old, "UNSIGNED-PAYLOAD", "s3", "us-east-1", time.Now().Add(-time.Hour)))
	presign := func(expires string, at time.Time) *http.Request {
		r, _ := http.NewRequest("GET", "https://b.s3.amazonaws.com/k?X-Amz-Expires="+expires, nil)
		u, _, err := signer.PresignHTTP(context.Background(), fake, r, "UNSIGNED-PAYLOAD", "s3", "us-east-1", at)
		require.NoError(t, err)
		return request(t, u, nil)
	}
	for name, r := range map[string]*http.Request{
		"signed an hour ago":         old,
		"presigned for a week":       presign("604800", time.Now()),
		"presigned in the future":    presign("300", time.Now().Add(time.Hour)),
		"presigned, expired":         presign("60", time.Now().Add(-10*time.Minute)),
		"presigned, without expires": presign("x", time.Now()),
	} {
		_, err := v.Inject("a1", r)
		var refused *vault.RefusedError
		assert.ErrorAs(t, err, &refused, name)
	}
	_, err := v.Inject("a1", presign("3600", time.Now()))
	assert.NoError(t, err, "an hour-long presigned URL")
}

// TestBufferedBodiesBounded: an agent cannot hold more than its share of
// request bodies in the gateway's memory; sending one gives its share
// back.
func TestBufferedBodiesBounded(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	var held []*http.Request
	for i := range vault.MaxBufferedBodiesPerAgent + 1 {
		r := sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", []byte("Action=GetCallerIdentity"), http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "sts")
		_, err := v.Inject("a1", r)
		if i < vault.MaxBufferedBodiesPerAgent {
			require.NoError(t, err, "body %d", i)
			held = append(held, r)
			continue
		}
		var refused *vault.RefusedError
		require.ErrorAs(t, err, &refused, "the share was exceeded")
		assert.Equal(t, vault.ReasonBuffersBusy, refused.Reason)
		assert.Contains(t, vault.BoundReasons(), err.Error(), "the refusal, as recorded, is not counted as a bound's")
	}
	held[0].Body.Close() // sent: its share comes back
	r := sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", []byte("Action=GetCallerIdentity"), http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "sts")
	_, err := v.Inject("a1", r)
	assert.NoError(t, err, "a body sent did not give its share back")
}

// TestRefusedInjectionGivesItsBufferBack: a request Inject refuses after
// reading its body is closed by Inject, so refusals never use up the
// agent's share.
func TestRefusedInjectionGivesItsBufferBack(t *testing.T) {
	v, ph := awsVault(t, realAWS)
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	for i := range 3 * vault.MaxBufferedBodiesPerAgent {
		r := sandboxSigned(t, ph, "POST", "https://sts.amazonaws.com/", []byte("Action=GetSessionToken"), form, "sts")
		_, err := v.Inject("a1", r)
		var refused *vault.RefusedError
		require.ErrorAs(t, err, &refused, "request %d", i)
		assert.NotEqual(t, vault.ReasonBuffersBusy, refused.Reason, "request %d: the share was used up by refusals", i)
	}
}
