package policy

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestQuotas(t *testing.T) {
	p, err := New(Config{Mode: Open})
	require.NoError(t, err)
	assert.Equal(t, Quotas{ConnectionsPerSecond: DefaultConnectionsPerSecond, DNSQueriesPerSecond: DefaultDNSQueriesPerSecond}, p.Quotas(), "zero means the defaults, and no byte limit")
	assert.Equal(t, p.Quotas(), (*Policy)(nil).Quotas(), "a nil policy has the defaults")
	assert.Equal(t, p.Quotas(), Deny("x").Quotas(), "a deny-all policy has the defaults")

	p, err = New(Config{Mode: Open, Quotas: Quotas{ConnectionsPerSecond: -1, DNSQueriesPerSecond: 20, BytesPerSecondUp: 1000, BytesPerSecondDown: -5}})
	require.NoError(t, err)
	assert.Equal(t, Quotas{DNSQueriesPerSecond: 20, BytesPerSecondUp: 1000}, p.Quotas(), "negative means no limit")

	for _, q := range []Quotas{
		{ConnectionsPerSecond: 0.5},
		{DNSQueriesPerSecond: math.NaN()},
		{ConnectionsPerSecond: math.Inf(1)},
		{BytesPerSecondDown: math.NaN()},
	} {
		_, err := New(Config{Mode: Open, Quotas: q})
		assert.Error(t, err, "%+v", q)
	}
}

func TestAgentContext(t *testing.T) {
	assert.Equal(t, "", AgentFrom(context.Background()))
	assert.Equal(t, "a1", AgentFrom(WithAgent(context.Background(), "a1")))
}
