package mitm

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
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

// TestRedactionGaps: an informational response's headers, and a body
// whose encoding is split over two Content-Encoding lines, do not carry
// the secret back.
func TestRedactionGaps(t *testing.T) {
	r := newRig(t)
	r.mux.HandleFunc("/hints", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Link", "</style.css?auth="+req.Header.Get("Authorization")+">; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		fmt.Fprintln(w, "done")
	})
	r.mux.HandleFunc("/two-encodings", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Add("Content-Encoding", "identity")
		w.Header().Add("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprintf(zw, "echo %s", req.Header.Get("Authorization"))
		zw.Close()
	})
	c := r.client(r.addr, false)
	c.Transport.(*http.Transport).DisableCompression = true
	var hints []string
	req, _ := http.NewRequest("GET", "https://api.test/hints", nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error { hints = append(hints, h.Get("Link")); return nil },
	}))
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEmpty(t, hints, "no early hints came")
	for _, h := range hints {
		assert.NotContains(t, h, secretValue, "an early hint carried the secret")
	}
	resp, err = c.Get("https://api.test/two-encodings")
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(raw)
	if resp.Header.Get("Content-Encoding") != "" {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		require.NoError(t, err)
		b, _ := io.ReadAll(zr)
		body = string(b)
	}
	assert.NotContains(t, body, secretValue, "a body in two Content-Encoding lines carried the secret")
}
