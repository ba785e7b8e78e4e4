package testkit

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// VerifyAppJWT checks an RS256 JWT as GitHub does: the signature, the
// issuer, and a lifetime of at most ten minutes that covers now.
func VerifyAppJWT(jwt string, pub *rsa.PublicKey, appID int64, now time.Time) error {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return errors.New("not a JWT")
	}
	enc := base64.RawURLEncoding
	var header struct{ Alg string }
	var claims struct {
		Iat, Exp int64
		Iss      string
	}
	h, _ := enc.DecodeString(parts[0])
	c, _ := enc.DecodeString(parts[1])
	sig, _ := enc.DecodeString(parts[2])
	if json.Unmarshal(h, &header) != nil || header.Alg != "RS256" || json.Unmarshal(c, &claims) != nil {
		return errors.New("malformed JWT")
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig); err != nil {
		return err
	}
	switch {
	case claims.Iss != fmt.Sprint(appID):
		return fmt.Errorf("issuer %q", claims.Iss)
	case claims.Exp-claims.Iat > 600:
		return errors.New("lifetime over ten minutes")
	case now.Unix() < claims.Iat || now.Unix() >= claims.Exp:
		return errors.New("expired or not yet valid")
	}
	return nil
}
