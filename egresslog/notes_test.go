package egresslog

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNotes(t *testing.T) {
	var none *Notes
	none.Add("ignored")
	assert.Equal(t, "closed", none.Annotate("closed"), "a nil Notes")
	assert.Nil(t, NotesFrom(context.Background()))

	n := new(Notes)
	ctx := WithNotes(context.Background(), n)
	NotesFrom(ctx).Add("suspected DNS tunnelling")
	NotesFrom(ctx).Add("suspected DNS tunnelling") // once
	assert.Equal(t, "closed; suspected DNS tunnelling", n.Annotate("closed"))
	assert.Equal(t, "suspected DNS tunnelling", n.Annotate(""))
	for i := range 10 {
		n.Add(string(rune('a' + i)))
	}
	assert.Equal(t, "x; suspected DNS tunnelling; a; b; c", n.Annotate("x"), "bounded")
}
