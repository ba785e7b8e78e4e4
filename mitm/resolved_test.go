package mitm

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

// TestResolvedAddressDeniedIntercepted: an intercepted request to an
// allowed name whose address a deny entry covers is refused at the dial.
func TestResolvedAddressDeniedIntercepted(t *testing.T) {
	r := newRig(t)
	var err error
	r.pol, err = policy.New(policy.Config{Mode: policy.Allowlist, Allow: []string{"api.test:*", "!127.0.0.2"}})
	require.NoError(t, err)
	resp, body := r.get(r.client(r.serveIntercepted("api.test"), false), "https://api.test/", nil)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "reached a denied address: %s", body)
	rec := r.waitRecord(func(rec egresslog.Record) bool { return rec.Kind == egresslog.KindHTTP })
	assert.Contains(t, rec.Reason, policy.ReasonDenyEntry, "record %+v", rec)
	assert.NotContains(t, body, "upstream saw", "the upstream was reached")
}
