package egresslog

import "context"

type connIDKey struct{}

// WithConnID returns a context that carries the ID of the recorded
// connection (Conn.ID) whose requests are served under it, so that
// whoever records those requests links them to it.
func WithConnID(ctx context.Context, id uint64) context.Context {
	return context.WithValue(ctx, connIDKey{}, id)
}

// ConnIDFrom returns the connection ID a context carries, or zero.
func ConnIDFrom(ctx context.Context) uint64 {
	id, _ := ctx.Value(connIDKey{}).(uint64)
	return id
}
