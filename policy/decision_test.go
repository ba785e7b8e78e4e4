package policy

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDecisionSaysWhatWasJudged lets a caller dial exactly what the
// policy judged: the canonical name, or the address in plain form.
func TestDecisionSaysWhatWasJudged(t *testing.T) {
	p, err := New(Config{Mode: Allowlist, Allow: []string{"api.example.com", "203.0.113.0/24"}})
	require.NoError(t, err)
	d := p.Decide("API.Example.COM.", 443)
	assert.True(t, d.Allowed)
	assert.Equal(t, "api.example.com", d.Name)
	assert.False(t, d.Addr.IsValid())

	d = p.Decide("0xcb.0.113.7", 443) // 203.0.113.7 in an inet_aton spelling
	assert.True(t, d.Allowed)
	assert.Equal(t, netip.MustParseAddr("203.0.113.7"), d.Addr)
	assert.Empty(t, d.Name)

	d = p.DecideAddr(netip.MustParseAddr("::ffff:203.0.113.8"), 443)
	assert.True(t, d.Allowed)
	assert.Equal(t, netip.MustParseAddr("203.0.113.8"), d.Addr, "mapped addresses are judged unmapped")

	d = p.Decide("other.example.com", 443)
	assert.False(t, d.Allowed)
	assert.Equal(t, "other.example.com", d.Name, "a denial names what it denied")

	d = p.Decide("bad name", 443)
	assert.False(t, d.Allowed)
	assert.Equal(t, ReasonInvalidHost, d.Reason)
	assert.Empty(t, d.Name)

	var none *Policy
	d = none.Decide("api.example.com", 443)
	assert.False(t, d.Allowed)
	assert.Equal(t, ReasonNoPolicy, d.Reason)
}

// TestEntryWrittenAsURL says that entries are host[:port].
func TestEntryWrittenAsURL(t *testing.T) {
	for _, e := range []string{"https://github.com", "http://github.com:8080/x", "user@github.com", "ftp://203.0.113.1", "GET https://github.com/x"} {
		_, err := New(Config{Mode: Allowlist, Allow: []string{e}})
		require.Error(t, err, e)
		assert.Contains(t, err.Error(), "entries are host[:port]", e)
	}
	_, err := New(Config{Mode: Allowlist, Allow: []string{"203.0.113.0/24", "[2001:db8::/32]:443"}})
	assert.NoError(t, err, "prefixes are not URLs")
}
