package egresslog

import (
	"context"
	"strings"
	"sync"
)

// Notes collect what work done on behalf of a record's subject found
// worth recording, which the one who records does not see: a lookup the
// gateway makes for a connection (its name suspected of DNS tunnelling,
// say) adds a note that the connection's record then carries. The zero
// Notes is empty, and a nil *Notes takes no note.
type Notes struct {
	mu   sync.Mutex
	list []string
}

// maxNotes bounds the notes kept, and so a record's reason.
const maxNotes = 4

// Add takes a note, once: a note already taken is not repeated.
func (n *Notes) Add(note string) {
	if n == nil || note == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, have := range n.list {
		if have == note {
			return
		}
	}
	if len(n.list) < maxNotes {
		n.list = append(n.list, note)
	}
}

// Annotate returns reason with the notes appended ("reason; note").
func (n *Notes) Annotate(reason string) string {
	if n == nil {
		return reason
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.list) == 0 {
		return reason
	}
	parts := append([]string{}, n.list...)
	if reason != "" {
		parts = append([]string{reason}, parts...)
	}
	return strings.Join(parts, "; ")
}

type notesKey struct{}

// WithNotes returns a context under which work takes notes into n.
func WithNotes(ctx context.Context, n *Notes) context.Context {
	return context.WithValue(ctx, notesKey{}, n)
}

// NotesFrom returns the Notes a context carries, or nil.
func NotesFrom(ctx context.Context) *Notes {
	n, _ := ctx.Value(notesKey{}).(*Notes)
	return n
}
