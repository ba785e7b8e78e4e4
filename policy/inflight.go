package policy

import "context"

// InFlight registers a request being forwarded with the block that
// handed over its connection, so that the request does not outlast a
// policy change that refuses it, or its agent: tproxy puts one in the
// context of every connection it hands to its Interceptor, and mitm
// registers each request it forwards (a WebSocket, a stream) with it.
// end ends the request, saying why; rejudge says why the agent's policy
// now refuses it, or "". The request is judged again as it registers:
// refused is true, and end called, if the policy changed or the agent
// was forgotten since it was judged. done is to be called when the
// request ends.
type InFlight func(end func(why string), rejudge func() string) (done func(), refused bool)

type inFlightKey struct{}

// WithInFlight returns a context carrying f, for the requests forwarded
// under it.
func WithInFlight(ctx context.Context, f InFlight) context.Context {
	return context.WithValue(ctx, inFlightKey{}, f)
}

// InFlightFrom returns the InFlight WithInFlight put in ctx, or nil.
func InFlightFrom(ctx context.Context) InFlight {
	f, _ := ctx.Value(inFlightKey{}).(InFlight)
	return f
}
