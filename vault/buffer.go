package vault

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Bodies the gateway reads whole before sending (to hash an AWS request,
// or to replace a placeholder in it) hold memory while the client sends
// them: each is at most MaxBufferedBody, and an agent may have
// MaxBufferedBodiesPerAgent of them at once, all agents
// MaxBufferedBodies.
const (
	MaxBufferedBody           = 1 << 20
	MaxBufferedBodiesPerAgent = 8
	MaxBufferedBodies         = 64
)

// ReasonBuffersBusy refuses a request whose body the gateway would read
// whole while its agent (or the gateway) already reads as many as it may.
const ReasonBuffersBusy = "too many request bodies being read at the gateway for this agent"

// BoundReasons are the reasons, as a refusal records them (RefusedError's
// Error), of refusals for the bound on bodies being read, which whoever
// counts refusals per agent counts however many other reasons an agent
// provokes.
func BoundReasons() []string {
	return []string{(&RefusedError{Reason: ReasonBuffersBusy}).Error()}
}

// readBody reads r's body whole (at most limit bytes, or the request is
// refused) within agent's share of the buffers, and puts it back to be
// sent; the share is given back when the body is closed, as the transport
// does once it is sent, or at once if reading fails.
func (v *Vault) readBody(agent string, r *http.Request, limit int64, why string) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		r.ContentLength = 0
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &RefusedError{Reason: fmt.Sprintf("a body of %d bytes %s: the gateway reads at most %d", r.ContentLength, why, limit)}
	}
	if !v.buffers.Acquire(agent, MaxBufferedBodiesPerAgent, MaxBufferedBodies) {
		return nil, &RefusedError{Reason: ReasonBuffersBusy}
	}
	release := sync.OnceFunc(func() { v.buffers.Release(agent) })
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	r.Body.Close()
	switch {
	case err != nil:
		release()
		return nil, fmt.Errorf("vault: reading a request body %s: %w", why, err)
	case int64(len(b)) > limit:
		release()
		return nil, &RefusedError{Reason: fmt.Sprintf("a body over %d bytes %s", limit, why)}
	}
	setBody(r, b, release)
	return b, nil
}

// setBody makes b r's body, releasing its buffer share when closed.
func setBody(r *http.Request, b []byte, release func()) {
	r.Body = &releasingBody{Reader: bytes.NewReader(b), release: release}
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	r.ContentLength = int64(len(b))
}

// releasingBody gives its buffer share back when closed.
type releasingBody struct {
	io.Reader
	release func()
}

func (b *releasingBody) Close() error { b.release(); return nil }
