package mitm

import (
	"context"
	"net/http"
	"sync/atomic"

	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/policy"
)

// inFlight registers r, about to be forwarded, with the policy.InFlight
// of the block that handed over its connection, if there is one, so that
// a policy change that refuses it (judged, its body gone on, by what
// judged was decided of: policy.DecideAgain), or its agent's removal,
// ends it while it is forwarded (a WebSocket, a stream, a long MCP tool
// call): it returns the context to forward it under, which that ends,
// with the handler's reads and writes on client; why it was ended, once
// it is; what to call when it is done; and whether it is refused at once.
func inFlight(r *http.Request, judged policy.Decision, info *connInfo, client *httpfwd.Client) (ctx context.Context, ended func() (string, bool), done func(), refused bool) {
	track := policy.InFlightFrom(r.Context())
	if track == nil {
		return r.Context(), func() (string, bool) { return "", false }, func() {}, false
	}
	ctx, cancel := context.WithCancel(r.Context())
	var why atomic.Pointer[string]
	end := func(reason string) {
		why.CompareAndSwap(nil, &reason)
		cancel()
		client.Stop()
	}
	rejudge := func() string {
		var now *policy.Policy
		if info.current != nil {
			now = info.current()
		}
		if d := now.DecideAgain(judged); !d.Allowed {
			return d.Reason
		}
		return ""
	}
	untrack, refused := track(end, rejudge)
	ended = func() (string, bool) {
		if w := why.Load(); w != nil {
			return *w, true
		}
		return "", false
	}
	return ctx, ended, func() { untrack(); cancel() }, refused
}
