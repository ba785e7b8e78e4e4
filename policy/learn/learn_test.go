package learn

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
)

func TestObservation(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name     string
		rec      egresslog.Record
		ok, succ bool
		port     uint16
	}{
		{"DNS answered", egresslog.Record{Agent: "a", Kind: egresslog.KindDNS, Host: "x.test", Allowed: true, Answers: 1}, true, true, 0},
		{"DNS NXDOMAIN", egresslog.Record{Agent: "a", Kind: egresslog.KindDNS, Host: "x.test", Allowed: true, Status: 3}, true, false, 0},
		{"TLS in report mode", egresslog.Record{Agent: "a", Kind: egresslog.KindTLS, Host: "x.test", Port: 443, Allowed: true, Report: true}, true, true, 443},
		{"TLS denied", egresslog.Record{Agent: "a", Kind: egresslog.KindTLS, Host: "x.test", Port: 443}, true, false, 443},
		{"upstream failed", egresslog.Record{Agent: "a", Kind: egresslog.KindTCP, Host: "x.test", Port: 22, Allowed: true, Reason: "upstream: refused"}, true, false, 22},
		{"no agent", egresslog.Record{Kind: egresslog.KindTLS, Host: "x.test", Port: 443, Allowed: true}, false, false, 0},
		{"no port", egresslog.Record{Agent: "a", Kind: egresslog.KindTLS, Host: "x.test", Allowed: true}, false, false, 0},
		{"report mode, a deny entry", egresslog.Record{Agent: "a", Kind: egresslog.KindTLS, Host: "x.test", Port: 443, Allowed: true, Report: true, Reason: policy.ReasonDenyEntry}, true, false, 443},
		{"report mode, a DoH resolver", egresslog.Record{Agent: "a", Kind: egresslog.KindHTTP, Host: "x.test", Port: 443, Allowed: true, Report: true, Reason: policy.ReasonDoH}, true, false, 443},
		{"report mode, DoT", egresslog.Record{Agent: "a", Kind: egresslog.KindTCP, Host: "x.test", Port: 853, Allowed: true, Report: true, Reason: policy.ReasonDoT}, true, false, 853},
	} {
		tc.rec.Time = now
		o, ok := Observation(tc.rec)
		assert.Equal(t, tc.ok, ok, tc.name)
		if ok {
			assert.Equal(t, tc.succ, o.Succeeded, tc.name)
			assert.Equal(t, tc.port, o.Port, tc.name)
		}
	}
}

// TestObservationOfARequest: an HTTP record gives its method and path,
// from which request entries are suggested; other records give none.
func TestObservationOfARequest(t *testing.T) {
	o, ok := Observation(egresslog.Record{Agent: "a", Kind: egresslog.KindHTTP, Host: "api.test", Port: 443, Method: "POST", Path: "/v1/x", Allowed: true, Status: 200})
	require.True(t, ok)
	assert.Equal(t, "POST", o.Method)
	assert.Equal(t, "/v1/x", o.Path)
	o, ok = Observation(egresslog.Record{Agent: "a", Kind: egresslog.KindTLS, Host: "api.test", Port: 443, Method: "GET", Allowed: true})
	require.True(t, ok)
	assert.Empty(t, o.Method+o.Path)
}

func TestRead(t *testing.T) {
	var b strings.Builder
	for _, r := range []egresslog.Record{
		{Agent: "a", Kind: egresslog.KindTLS, Host: "x.test", Port: 443, Allowed: true},
		{Agent: "b", Kind: egresslog.KindTLS, Host: "y.test", Port: 443, Allowed: true},
	} {
		b.Write(append(r.AppendJSON(nil), '\n'))
	}
	obs, skipped, err := Read(strings.NewReader(b.String()+"{\"time\":\"2026-12-01T00:00:00Z\",\"agent\":\"a\",\"ki\n"), "a")
	require.NoError(t, err)
	require.Len(t, obs, 1)
	assert.Equal(t, "x.test", obs[0].Host)
	assert.Equal(t, 1, skipped, "a line cut short is skipped and counted")

	// An audited file's own lines, and one saying records were dropped,
	// hold no record, and are not unreadable.
	audited := `{"segment":true,"chain":1,"prev":"00"}` + "\n" + `{"resume":true,"unvouched":2,"chain":2,"prev":"01"}` + "\n" + b.String() + `{"dropped":7,"time":"2026-12-01T00:00:00Z","chain":4,"prev":"ef"}` + "\n" + `{"seal":4,"hash":"ab","sig":"cd"}` + "\n"
	obs, skipped, err = Read(strings.NewReader(audited), "")
	require.NoError(t, err)
	assert.Len(t, obs, 2)
	assert.Zero(t, skipped)
}

func TestWriteSupport(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := policy.Suggest([]policy.Observation{
		{Host: "api.test", Port: 443, Time: at, Succeeded: true},
		{Host: "api.test", Port: 443, Time: at.Add(time.Minute), Succeeded: true},
		{Host: "evil.test", Port: 443, Time: at, Succeeded: false},
	}, policy.SuggestConfig{})
	var b strings.Builder
	WriteSupport(&b, s, "alice", 3, 1)
	assert.Contains(t, b.String(), "# From 3 records of alice (1 unreadable, skipped).")
	assert.Regexp(t, `#   api\.test +2  2026-12-01T00:00:00Z  2026-12-01T00:01:00Z`, b.String())
	assert.Contains(t, b.String(), "# only attempted, left out: evil.test (1)")
	for line := range strings.SplitSeq(strings.TrimSpace(b.String()), "\n") {
		assert.True(t, strings.HasPrefix(line, "#"), "not a comment: %q", line)
	}
}
