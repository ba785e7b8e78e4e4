// Package awssig signs requests for vault's AWSSigV4 mode with AWS's own
// Signature Version 4 signer (aws-sdk-go-v2). It is apart from vault so
// that only a program that re-signs AWS requests links the AWS SDK:
//
//	v, err := vault.Open(storage, key, vault.Config{SigV4: awssig.Signer{}})
package awssig

import (
	"context"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/agenthold/egress/vault"
)

// Signer is a vault.SigV4Signer. Its zero value is ready to use.
type Signer struct{}

var _ vault.SigV4Signer = Signer{}

// Sign sets r's Authorization and X-Amz-Date headers (and
// X-Amz-Security-Token, for temporary credentials).
func (Signer) Sign(ctx context.Context, r *http.Request, s vault.SigV4) error {
	return signer(s).SignHTTP(ctx, credentials(s), r, s.PayloadHash, s.Service, s.Region, s.Time)
}

// Presign returns r's URL with a presigned query.
func (Signer) Presign(ctx context.Context, r *http.Request, s vault.SigV4) (string, error) {
	u, _, err := signer(s).PresignHTTP(ctx, credentials(s), r, s.PayloadHash, s.Service, s.Region, s.Time)
	return u, err
}

func signer(s vault.SigV4) *v4.Signer {
	return v4.NewSigner(func(o *v4.SignerOptions) {
		o.DisableURIPathEscaping = s.PathAsSent
		o.DisableHeaderHoisting = true
	})
}

func credentials(s vault.SigV4) aws.Credentials {
	c := s.Credentials
	return aws.Credentials{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey, SessionToken: c.SessionToken}
}
