package tproxy

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/agenthold/egress/internal/httpmeter"
)

// upgraded is the upstream side of a plain HTTP exchange that switched
// protocols (101: a WebSocket, say), which the forwarder then copies to
// and from the client's connection until either ends. It is the one
// place such a tunnel's bytes pass: they are counted for its record,
// held to the agent's quotas (on the explicit proxy: a transparent
// connection is held on the connection itself), and noted as its
// request's activity (forwarding), which the idle sweep and a forced
// shutdown find. It is a session of its own, which Shutdown waits for:
// the server it came through no longer knows the connection it took
// over.
type upgraded struct {
	io.ReadWriteCloser
	paceUp, paceDown *pacer
	up, down         atomic.Int64
	request          *forwarding
}

// beginUpgrade takes over res, st's upstream's switch of protocols; an
// error, and the upstream closed, if it cannot begin.
func (p *Proxy) beginUpgrade(st *plainState, res *http.Response) error {
	rwc, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		return nil // the forwarder refuses the switch
	}
	if !p.beginSession() {
		rwc.Close()
		return errors.New(ReasonShuttingDown)
	}
	st.upgraded = &upgraded{ReadWriteCloser: rwc, paceUp: st.paceUp, paceDown: st.paceDown, request: st.forwarding}
	res.Body = st.upgraded
	// Its head, which the forwarder writes to the client connection it
	// takes over, beneath every response writer.
	head := httpmeter.ResponseHeadSize(res.StatusCode, res.Header)
	st.paceDown.moved(head)
	st.upgraded.down.Add(head)
	st.rec.Status = res.StatusCode
	return nil
}

// endUpgrade is the end of u, once the forwarder is done with it. It
// closes the upstream: the forwarder does not when it refuses the switch
// (to another protocol than the one asked for), and the connection would
// stay open for as long as the upstream liked.
func (p *Proxy) endUpgrade(u *upgraded) {
	u.Close()
	p.sessionsWG.Done()
}

// Read reads what the upstream sends the client.
func (u *upgraded) Read(p []byte) (int, error) {
	n, err := u.paceDown.read(u.ReadWriteCloser, p)
	if n > 0 {
		u.request.touch()
		u.down.Add(int64(n))
	}
	return n, err
}

// Write writes what the client sends the upstream.
func (u *upgraded) Write(p []byte) (int, error) {
	n, err := u.paceUp.write(u.ReadWriteCloser, p)
	if n > 0 {
		u.request.touch()
		u.up.Add(int64(n))
	}
	return n, err
}
