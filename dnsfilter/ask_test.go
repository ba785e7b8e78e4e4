package dnsfilter

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/approval"
)

// TestAskModeHoldsTheQuery: a lookup of a name no entry allows, under a
// policy in ask mode, is held and never forwarded until approved; once
// approved it is answered; refused, it gets NXDOMAIN; Shutdown ends the
// wait of one still held.
func TestAskModeHoldsTheQuery(t *testing.T) {
	b := &approval.Broker{Timeout: 10 * time.Second}
	h := newHarness(t, nil, func(s *Server) { s.Approver = b })
	h.setPolicy(policy.Config{Ask: true})
	pendingID := func(name string) string {
		var id string
		require.Eventually(t, func() bool {
			for _, r := range b.Pending() {
				if r.Name == name {
					id = r.ID
					return true
				}
			}
			return false
		}, 5*time.Second, time.Millisecond)
		return id
	}
	got := make(chan *dns.Msg, 1)
	go func() { got <- h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false) }()
	id := pendingID("a.test")
	assert.Zero(t, h.up.count("a.test"), "forwarded before it was approved")
	require.NoError(t, b.Answer(id, approval.Once, "test", false))
	resp := <-got
	assert.Equal(t, dns.RcodeSuccess, resp.Rcode)
	assert.Equal(t, []string{"140.82.112.3"}, answerStrings(resp))

	go func() { got <- h.query("udp", "127.0.0.1", "cname.test", dns.TypeA, false) }()
	require.NoError(t, b.Answer(pendingID("cname.test"), approval.Deny, "test", false))
	assert.Equal(t, dns.RcodeNameError, (<-got).Rcode)
	assert.Zero(t, h.up.count("cname.test"))

	held := make(chan error, 1)
	go func() {
		c := dns.Client{Timeout: 5 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion("stray.test.", dns.TypeA)
		_, _, err := c.Exchange(m, h.addr)
		held <- err
	}()
	pendingID("stray.test")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // the broker would hold it 10 s
	defer cancel()
	require.NoError(t, h.srv.Shutdown(ctx), "Shutdown waited for a held query")
	<-held
}

// TestForgetDuringApproval: an answer to a query that waited for a
// person while its agent was forgotten is not remembered for the agent.
func TestForgetDuringApproval(t *testing.T) {
	b := &approval.Broker{Timeout: 10 * time.Second}
	h := newHarness(t, nil, func(s *Server) { s.Approver = b })
	h.setPolicy(policy.Config{Ask: true})
	got := make(chan *dns.Msg, 1)
	go func() { got <- h.query("udp", "127.0.0.1", "a.test", dns.TypeA, false) }()
	var id string
	require.Eventually(t, func() bool {
		if p := b.Pending(); len(p) == 1 {
			id = p[0].ID
		}
		return id != ""
	}, 5*time.Second, time.Millisecond, "the query was not held")
	h.srv.Forget("a1")
	require.NoError(t, b.Answer(id, approval.Once, "test", false))
	require.Equal(t, []string{"140.82.112.3"}, answerStrings(<-got))
	assert.Empty(t, h.srv.Names("a1", netip.MustParseAddr("140.82.112.3")), "an answer approved after Forget was remembered")
}

// TestApprovedNameResolvesThroughItsChain: an approved name behind a
// CNAME (a CDN's) is answered, since its chain is how it resolves; a
// query of a type never forwarded is refused without asking anyone.
func TestApprovedNameResolvesThroughItsChain(t *testing.T) {
	b := &approval.Broker{Timeout: 10 * time.Second}
	h := newHarness(t, nil, func(s *Server) { s.Approver = b })
	h.setPolicy(policy.Config{Ask: true})
	got := make(chan *dns.Msg, 1)
	go func() { got <- h.query("udp", "127.0.0.1", "cdn.test", dns.TypeA, false) }()
	var id string
	require.Eventually(t, func() bool {
		if p := b.Pending(); len(p) == 1 && p[0].Name == "cdn.test" {
			id = p[0].ID
		}
		return id != ""
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, b.Answer(id, approval.Session, "alice", false))
	resp := <-got
	assert.Equal(t, dns.RcodeSuccess, resp.Rcode, "%+v", h.lastRecord())
	assert.Equal(t, []string{"CNAME edge.cdn.example.", "140.82.112.9"}, answerStrings(resp))

	resp = h.query("udp", "127.0.0.1", "null.example", dns.TypeNULL, false)
	assert.Equal(t, dns.RcodeNotImplemented, resp.Rcode)
	assert.Empty(t, b.Pending(), "a type never forwarded was asked about")
}
