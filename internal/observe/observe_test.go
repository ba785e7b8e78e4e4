package observe

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/egresslog"
)

func TestOf(t *testing.T) {
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
	} {
		tc.rec.Time = now
		o, ok := Of(tc.rec)
		assert.Equal(t, tc.ok, ok, tc.name)
		if ok {
			assert.Equal(t, tc.succ, o.Succeeded, tc.name)
			assert.Equal(t, tc.port, o.Port, tc.name)
		}
	}
}

func TestRead(t *testing.T) {
	var b strings.Builder
	for _, r := range []egresslog.Record{
		{Agent: "a", Kind: egresslog.KindTLS, Host: "x.test", Port: 443, Allowed: true},
		{Agent: "b", Kind: egresslog.KindTLS, Host: "y.test", Port: 443, Allowed: true},
	} {
		b.Write(append(r.AppendJSON(nil), '\n'))
	}
	obs, err := Read(strings.NewReader(b.String()), "a")
	require.NoError(t, err)
	require.Len(t, obs, 1)
	assert.Equal(t, "x.test", obs[0].Host)
	_, err = Read(strings.NewReader("{not json\n"), "")
	assert.Error(t, err)
}
