//go:build linux

package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// remoteAgents registers n remote agents and returns their tokens.
func remoteAgents(tb testing.TB, as *agents, n int) []string {
	tb.Helper()
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = rand.Text()
		sum := sha256.Sum256([]byte(tokens[i]))
		a := &agent{spec: AgentSpec{Name: fmt.Sprintf("remote%d", i), Remote: true, TokenHash: hex.EncodeToString(sum[:])}}
		require.NoError(tb, as.add(a))
	}
	return tokens
}

// TestRemoteAgentByToken: a token names its own agent, with the name or
// without it (a Bearer token), never another; a deleted agent's token
// names no one, nor does a token the registry holds no valid hash for.
func TestRemoteAgentByToken(t *testing.T) {
	as := newAgents(t.TempDir())
	tokens := remoteAgents(t, as, 3)
	for i, tok := range tokens {
		name, _, err := as.byToken("", tok)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("remote%d", i), name)
		name, _, err = as.byToken(name, tok)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("remote%d", i), name)
	}
	_, _, err := as.byToken("remote1", tokens[0])
	assert.ErrorIs(t, err, errBadToken, "another agent's token")
	_, _, err = as.byToken("", "not-a-token")
	assert.ErrorIs(t, err, errBadToken)
	_, err = as.remove("remote2")
	require.NoError(t, err)
	_, _, err = as.byToken("", tokens[2])
	assert.ErrorIs(t, err, errBadToken, "a deleted agent's token")
	require.NoError(t, as.add(&agent{spec: AgentSpec{Name: "edited", Remote: true, TokenHash: "not hex"}}))
	_, _, err = as.byToken("edited", "")
	assert.ErrorIs(t, err, errBadToken, "an agent whose hash does not decode")
}

// BenchmarkRemoteAgentByToken: identifying a remote agent by its token,
// as every request on egress.remote_listen does, with 10 and with 1,000
// remote agents registered.
func BenchmarkRemoteAgentByToken(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			as := newAgents(b.TempDir())
			tokens := remoteAgents(b, as, n)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, _, err := as.byToken("", tokens[i%n]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
