package mitm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/internal/testkit"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/vault"
)

// realAWS are the credentials only the gateway and the fake AWS know.
var realAWS = aws.Credentials{AccessKeyID: "AKIAREALKEYID0000042", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYREALSECRET", SessionToken: "IQoJb3JpZ2luX2VjEREALSESSIONTOKEN"}

// fakeAWS verifies SigV4 with the real credentials, as AWS does: an S3
// bucket (PUT and GET of objects) and STS's GetCallerIdentity, which
// quotes the access key ID it was called with.
type fakeAWS struct {
	mu      sync.Mutex
	objects map[string][]byte
}

func (f *fakeAWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := testkit.VerifySigV4(r, body, realAWS, time.Now()); err != nil {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, "<Error><Code>SignatureDoesNotMatch</Code><Message>%v</Message></Error>", err)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.HasPrefix(r.Host, "sts."):
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/agent</Arn><UserId>%s</UserId><Account>123456789012</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>r1</RequestId></ResponseMetadata></GetCallerIdentityResponse>`, r.Header.Get("Authorization"))
	case r.Method == http.MethodPut:
		f.objects[r.URL.Path] = body
		w.Header().Set("ETag", `"1"`)
	case r.Method == http.MethodGet:
		b, ok := f.objects[r.URL.Path]
		if !ok {
			http.Error(w, "<Error><Code>NoSuchKey</Code></Error>", http.StatusNotFound)
			return
		}
		w.Write(b)
	}
}

// TestAWSThroughInterception: the AWS SDK for Go in the sandbox, holding
// only the placeholder, puts an object with a streaming body, reads it
// back through a presigned URL, and calls STS; the fake AWS verifies every
// signature with the real credentials. Nothing the sandbox receives and
// nothing recorded holds them.
func TestAWSThroughInterception(t *testing.T) {
	r := newRig(t)
	const bucketHost, stsHost = "bucket.s3.us-west-2.amazonaws.com", "sts.us-west-2.amazonaws.com"
	loop := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	r.ic.Resolver.(testkit.Resolver)[bucketHost] = loop
	r.ic.Resolver.(testkit.Resolver)[stsHost] = loop
	var err error
	r.pol, err = policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"*.amazonaws.com:*"}})
	require.NoError(t, err)
	require.NoError(t, r.vault.Set(vault.Secret{Name: "aws", Rule: vault.Rule{Hosts: []string{"*.amazonaws.com"}, Mode: vault.AWSSigV4}},
		[]byte(realAWS.AccessKeyID+":"+realAWS.SecretAccessKey+":"+realAWS.SessionToken)))
	att, err := r.vault.Attach("a1", "aws", "AWS_ACCESS_KEY_ID")
	require.NoError(t, err)
	ph := att.Placeholder
	fake := &fakeAWS{objects: map[string][]byte{}}
	var logged syncBuffer // every operational log line, for the canary
	r.ic.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.mux.Handle(bucketHost+"/", fake)
	r.mux.Handle(stsHost+"/", fake)

	cfg := aws.Config{
		Region: "us-west-2",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: ph, SecretAccessKey: ph, SessionToken: ph}, nil
		}),
		RetryMaxAttempts: 1,
	}
	ctx := context.Background()
	s3c := s3.NewFromConfig(cfg, func(o *s3.Options) { o.HTTPClient = r.client(r.serveIntercepted(bucketHost), true) })

	// Streaming bodies the SDK cannot seek: with an unsigned payload, and
	// in aws-chunked encoding with a trailing checksum.
	content := strings.Repeat("streamed through the gateway ", 2000)
	_, err = s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bucket"), Key: aws.String("dir/chunked.txt"), Body: io.MultiReader(strings.NewReader(content)),
		ContentLength: aws.Int64(int64(len(content))), ChecksumAlgorithm: types.ChecksumAlgorithmCrc32})
	require.NoError(t, err, "PutObject, aws-chunked with a trailing checksum")
	_, err = s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bucket"), Key: aws.String("dir/object.txt"), Body: io.MultiReader(strings.NewReader(content)), ContentLength: aws.Int64(int64(len(content)))})
	require.NoError(t, err, "PutObject")
	fake.mu.Lock()
	stored, chunked := string(fake.objects["/dir/object.txt"]), string(fake.objects["/dir/chunked.txt"])
	fake.mu.Unlock()
	assert.Equal(t, content, stored, "the object's bytes")
	assert.Contains(t, chunked, "x-amz-checksum-crc32", "the chunked upload's trailer")

	presigned, err := s3.NewPresignClient(s3c).PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bucket"), Key: aws.String("dir/object.txt")}, s3.WithPresignExpires(5*time.Minute))
	require.NoError(t, err)
	resp, got := r.get(r.client(r.serveIntercepted(bucketHost), false), presigned.URL, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "presigned GET: %s", got)
	assert.Equal(t, stored, got, "presigned GET")

	// A client that signs Accept-Encoding, which the gateway rewrites to
	// read the response: the signature covers what is sent.
	req, _ := http.NewRequest("GET", "https://"+bucketHost+"/dir/object.txt", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
	require.NoError(t, v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true }).SignHTTP(ctx,
		aws.Credentials{AccessKeyID: ph, SecretAccessKey: ph}, req, "UNSIGNED-PAYLOAD", "s3", "us-west-2", time.Now()))
	require.Contains(t, req.Header.Get("Authorization"), "accept-encoding", "the test signs Accept-Encoding")
	signedResp, err := r.client(r.serveIntercepted(bucketHost), false).Do(req)
	require.NoError(t, err)
	signedBody, _ := io.ReadAll(signedResp.Body)
	signedResp.Body.Close()
	assert.Equal(t, http.StatusOK, signedResp.StatusCode, "a signed Accept-Encoding: %s", signedBody)

	stsc := sts.NewFromConfig(cfg, func(o *sts.Options) { o.HTTPClient = r.client(r.serveIntercepted(stsHost), true) })
	id, err := stsc.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	require.NoError(t, err, "GetCallerIdentity")
	assert.Equal(t, "123456789012", aws.ToString(id.Account))
	assert.Contains(t, aws.ToString(id.UserId), ph, "the echoed key ID was not redacted to the placeholder")

	// STS would hand the sandbox credentials of its own: refused.
	_, err = stsc.GetSessionToken(ctx, &sts.GetSessionTokenInput{DurationSeconds: aws.Int32(129600)})
	require.Error(t, err, "GetSessionToken was re-signed")
	denied := r.waitRecord(func(rec egresslog.Record) bool { return !rec.Allowed && rec.Kind == egresslog.KindHTTP })
	assert.Contains(t, denied.Reason, "credentials of its own", "record %+v", denied)

	// Canary: the real credentials appear nowhere the sandbox or a
	// reader of the records could see.
	for _, secret := range []string{realAWS.AccessKeyID, realAWS.SecretAccessKey, realAWS.SessionToken} {
		assert.NotContains(t, aws.ToString(id.UserId), secret)
		assert.NotContains(t, got, secret)
		for _, rec := range r.log.List(egresslog.Filter{}, 0) {
			assert.NotContains(t, string(rec.AppendJSON(nil)), secret, "a record holds a credential")
		}
	}
	recs := r.log.List(egresslog.Filter{Kind: egresslog.KindHTTP}, 0)
	require.NotEmpty(t, recs)
	for _, rec := range recs {
		if rec.Allowed {
			assert.Equal(t, "aws", rec.Secret, "record %+v", rec)
		}
	}

	// A key that is not the placeholder is refused before it leaves.
	other := s3.NewFromConfig(aws.Config{Region: "us-west-2", RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIAOTHER", SecretAccessKey: "x"}, nil
		})},
		func(o *s3.Options) { o.HTTPClient = r.client(r.serveIntercepted(bucketHost), true) })
	_, err = other.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("bucket"), Key: aws.String("dir/object.txt")})
	require.Error(t, err, "a request signed with another key went through")
	rec := r.waitRecord(func(rec egresslog.Record) bool {
		return !rec.Allowed && rec.Kind == egresslog.KindHTTP && strings.Contains(rec.Reason, "placeholder")
	})
	assert.Contains(t, rec.Reason, "not the agent's placeholder", "record %+v", rec)

	// Nor in any log line, refusals included.
	for _, secret := range []string{realAWS.AccessKeyID, realAWS.SecretAccessKey, realAWS.SessionToken} {
		assert.NotContains(t, logged.String(), secret, "a log line holds a credential")
	}
}

// TestRefusedBodiesGiveTheirBufferBack: requests refused after the
// gateway read their bodies do not hold the agent's share of buffers: far
// more of them than the share still each get their own refusal.
func TestRefusedBodiesGiveTheirBufferBack(t *testing.T) {
	r := newRig(t)
	const stsHost = "sts.us-west-2.amazonaws.com"
	r.ic.Resolver.(testkit.Resolver)[stsHost] = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	var err error
	r.pol, err = policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"*.amazonaws.com:*"}})
	require.NoError(t, err)
	require.NoError(t, r.vault.Set(vault.Secret{Name: "aws", Rule: vault.Rule{Hosts: []string{"*.amazonaws.com"}, Mode: vault.AWSSigV4}}, []byte(realAWS.AccessKeyID+":"+realAWS.SecretAccessKey)))
	att, err := r.vault.Attach("a1", "aws", "AWS_ACCESS_KEY_ID")
	require.NoError(t, err)
	cfg := aws.Config{Region: "us-west-2", RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: att.Placeholder, SecretAccessKey: att.Placeholder}, nil
		})}
	stsc := sts.NewFromConfig(cfg, func(o *sts.Options) { o.HTTPClient = r.client(r.serveIntercepted(stsHost), true) })
	r.log.DenialBurst = 3 * vault.MaxBufferedBodiesPerAgent // every refusal recorded on its own, none folded into a summary
	for i := range 3 * vault.MaxBufferedBodiesPerAgent {
		_, err := stsc.GetSessionToken(context.Background(), &sts.GetSessionTokenInput{})
		require.Error(t, err, "attempt %d", i)
		require.NotContains(t, err.Error(), "bodies being read", "attempt %d: the buffers were not given back", i)
	}
	// The client sees a status; the records say which refusal it was.
	recs := r.log.List(egresslog.Filter{Kind: egresslog.KindHTTP, DeniedOnly: true}, 0)
	require.Len(t, recs, 3*vault.MaxBufferedBodiesPerAgent)
	for i, rec := range recs {
		assert.NotEqual(t, vault.ReasonBuffersBusy, strings.TrimPrefix(rec.Reason, "vault: "), "request %d: the buffers were not given back", i)
		assert.Contains(t, rec.Reason, "credentials of its own", "request %d", i)
	}
}
