package mitm

import (
	"io"
	"net/http"
	"sync/atomic"

	"github.com/agenthold/egress/internal/httpmeter"
)

// upgraded is the upstream side of an exchange that switched protocols
// (101: a WebSocket), which the forwarder copies to and from the
// sandbox's connection until either ends: its bytes are counted here
// for the request's record, and it is closed when the request is done,
// which the forwarder does not do when it refuses the switch (to another
// protocol than the one asked for).
type upgraded struct {
	io.ReadWriteCloser
	up, down atomic.Int64
}

// takeUpgrade puts res's switched connection under st, if it switched.
func takeUpgrade(st *reqState, res *http.Response) {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return
	}
	if rwc, ok := res.Body.(io.ReadWriteCloser); ok { // else the forwarder refuses the switch
		st.upgraded = &upgraded{ReadWriteCloser: rwc}
		// Its head too, which the forwarder writes beneath every
		// response writer.
		st.upgraded.down.Store(httpmeter.ResponseHeadSize(res.StatusCode, res.Header))
		res.Body = st.upgraded
	}
}

// Read reads what the upstream sends the sandbox.
func (u *upgraded) Read(p []byte) (int, error) {
	n, err := u.ReadWriteCloser.Read(p)
	u.down.Add(int64(n))
	return n, err
}

// Write writes what the sandbox sends the upstream.
func (u *upgraded) Write(p []byte) (int, error) {
	n, err := u.ReadWriteCloser.Write(p)
	u.up.Add(int64(n))
	return n, err
}
