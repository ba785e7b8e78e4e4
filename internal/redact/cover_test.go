package redact

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCovers(t *testing.T) {
	r := New(Forms("tok-1", "ph"))
	assert.True(t, r.Covers("tok-1"))
	assert.False(t, r.Covers("tok-2"), "a value it was not made with")
	assert.False(t, r.Covers("tok"), "a part of a value is not the value")
	assert.False(t, (*Replacer)(nil).Covers("tok-1"))
	assert.True(t, r.CoversReplacements(New([]Pair{{Find: "ph", Replace: "tok-1"}})))
	assert.False(t, r.CoversReplacements(New([]Pair{{Find: "ph", Replace: "tok-2"}})), "a substitution of a value it does not redact")
	assert.True(t, r.CoversReplacements(nil))
	assert.Nil(t, ReplacerFrom(context.Background()))
	assert.Same(t, r, ReplacerFrom(WithReplacer(context.Background(), r)))
}
