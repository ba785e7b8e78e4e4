package egresslog

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCountedReasonsNeverMerged: an agent that provokes many distinct
// denial reasons fills the bound, but cannot push a counted reason into
// "other".
func TestCountedReasonsNeverMerged(t *testing.T) {
	l := &Log{CountedReasons: []string{"quota exceeded: x"}}
	for i := range 200 {
		l.Record(Record{Agent: "a", Reason: fmt.Sprintf("upstream failed: address %d", i)})
	}
	for range 3 {
		l.Record(Record{Agent: "a", Reason: "quota exceeded: x"})
	}
	l.Record(Record{Agent: "a", Reason: "another"})
	s := l.Stats()["a"]
	assert.EqualValues(t, 3, s.DeniedByReason["quota exceeded: x"])
	assert.EqualValues(t, 200-maxReasonKeys+1, s.DeniedByReason["other"])
	assert.Len(t, s.DeniedByReason, maxReasonKeys+2, "the bound, other, and the counted reason")
	assert.EqualValues(t, 204, s.Denied)
}
