//go:build linux

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/policyfile"
)

// TestSuggestionKeepsTheCurrentRefusals: what the current file refuses
// (deny entries, in a deny list or among allowOut, its DoH endpoints) and
// its private-network setting survive into the suggestion, and a name the
// sandbox reached only because report mode let a deny entry pass is not
// learnt.
func TestSuggestionKeepsTheCurrentRefusals(t *testing.T) {
	keep, err := policyfile.Decode([]byte("enforce: true\nreport: true\nallowOut: ['!pastebin.com', api.test]\ndeny: ['*.ngrok.io']\ndohEndpoints: [doh.internal.example]\nallowPrivateNetworks: true\n"))
	require.NoError(t, err)
	now := time.Now()
	s := policy.Suggest([]policy.Observation{
		{Host: "api.test", Port: 443, Time: now, Succeeded: true},
		{Host: "pastebin.com", Port: 443, Time: now, Succeeded: false}, // what learn.Observation makes of a report-mode deny
	}, policy.SuggestConfig{})
	var out strings.Builder
	require.NoError(t, writeSuggestion(&out, s, keep, 2, 0))
	p, err := policyfile.Parse([]byte(out.String()))
	require.NoError(t, err, out.String())
	assert.True(t, p.Decide("api.test", 443).Allowed, out.String())
	assert.False(t, p.Decide("pastebin.com", 443).Allowed, out.String())
	assert.False(t, p.Decide("x.ngrok.io", 443).Allowed, out.String())
	assert.True(t, p.AllowPrivateNetworks(), out.String())
	assert.Contains(t, out.String(), "doh.internal.example")
	assert.NotContains(t, out.String(), "report: true", "the suggestion stays in report mode")
}
