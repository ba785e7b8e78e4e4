package tproxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"syscall"

	"github.com/agenthold/egress/internal/httpfwd"
	"github.com/agenthold/egress/netguard"
	"github.com/agenthold/egress/policy"
)

// ProxyStatusName identifies this proxy in the Proxy-Status header field
// (RFC 9209) of its refusals and errors.
const ProxyStatusName = httpfwd.ProxyStatusName

// answer is how the explicit proxy tells a client it did not get what it
// asked for: an HTTP status, an RFC 9209 error type, and the reason.
type answer struct {
	status  int
	errType string // RFC 9209 proxy error type
	why     string // for the record
	// details is what the client is told, when it must be less than why:
	// an upstream's internal address, the gateway's resolver.
	details string
	refused bool // a refusal (policy, guard, budget), not a failure
	// challenge asks for credentials (407): Proxy-Authenticate.
	challenge bool
	// unrecorded: a source that no agent owns refused more often than
	// its records are kept (so that strangers cannot fill the log).
	unrecorded bool
	// jsonrpc, for a refused MCP message, is the JSON-RPC answer sent
	// instead of an HTTP error (policy.Decision.JSONRPCReply).
	jsonrpc string
}

// denied is a refusal by the policy or the gateway's rules.
func denied(status int, why string) answer {
	return answer{status: status, errType: "http_request_denied", why: why, refused: true}
}

// refusedBy is a policy's refusal: the record keeps the reason and the
// entry apart, the client is told both.
func refusedBy(d policy.Decision) answer {
	a := denied(http.StatusForbidden, d.Reason)
	if d.Rule != "" {
		a.details = d.Reason + ": " + d.Rule
	}
	if d.JSONRPCReply != "" {
		a.status, a.jsonrpc = http.StatusOK, d.JSONRPCReply
	}
	return a
}

// write sends the answer: the status, a Proxy-Status field, and the
// reason in the body.
func (a answer) write(w http.ResponseWriter) {
	details := a.details
	if details == "" {
		details = a.why
	}
	if a.jsonrpc != "" {
		httpfwd.RefuseJSONRPC(w, details, a.jsonrpc)
		return
	}
	if a.challenge {
		w.Header().Set("Proxy-Authenticate", `Basic realm="`+ProxyStatusName+`"`)
		w.Header().Set("Connection", "close") // no second try on this connection
	}
	httpfwd.Refuse(w, a.status, a.errType, details, a.refused)
}

// dialAnswer says why an upstream dial failed: a refused address is 403,
// a name that does not resolve or a connection refused is 502, a timeout
// 504. The record gets the whole error; the client, what it may know
// (never the address a name resolved to, nor the gateway's resolver).
func dialAnswer(err error) answer {
	why := reasonUpstreamPrefix + err.Error()
	var dnsErr *net.DNSError
	var denied *netguard.DeniedError
	var resolved *policy.ResolvedError
	switch {
	case errors.As(err, &resolved):
		return answer{status: http.StatusForbidden, errType: "destination_ip_prohibited", why: why, refused: true,
			details: "the destination's address is refused: " + resolved.Reason}
	case errors.As(err, &denied):
		return answer{status: http.StatusForbidden, errType: "destination_ip_prohibited", why: why, refused: true,
			details: "the destination's address is refused: " + denied.Class.Tier.String()}
	case errors.Is(err, netguard.ErrDenied):
		return answer{status: http.StatusForbidden, errType: "destination_ip_prohibited", why: why, refused: true,
			details: "the destination's address is refused"}
	case errors.As(err, &dnsErr) && dnsErr.IsTimeout:
		return answer{status: http.StatusGatewayTimeout, errType: "dns_timeout", why: why, details: "resolving " + dnsErr.Name + " timed out"}
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return answer{status: http.StatusBadGateway, errType: "destination_not_found", why: why, details: dnsErr.Name + " does not resolve"}
	case errors.As(err, &dnsErr):
		return answer{status: http.StatusBadGateway, errType: "dns_error", why: why, details: "resolving " + dnsErr.Name + " failed"}
	case errors.Is(err, syscall.ECONNREFUSED):
		return answer{status: http.StatusBadGateway, errType: "connection_refused", why: why, details: "connection refused"}
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return answer{status: http.StatusBadGateway, errType: "destination_ip_unroutable", why: why, details: "no route to the destination"}
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return answer{status: http.StatusGatewayTimeout, errType: "connection_timeout", why: why, details: "connection timed out"}
	}
	return answer{status: http.StatusBadGateway, errType: "destination_unavailable", why: why, details: "the destination is unavailable"}
}

// budgetAnswer is the answer to a request refused for a budget or quota.
func budgetAnswer(why string) answer {
	return answer{status: http.StatusServiceUnavailable, errType: "connection_limit_reached", why: why, refused: true}
}
