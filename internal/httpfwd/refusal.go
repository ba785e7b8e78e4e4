package httpfwd

import (
	"io"
	"net/http"
	"strings"
)

// ProxyStatusName identifies the gateway in the Proxy-Status field (RFC
// 9209) of its refusals and errors.
const ProxyStatusName = "egress"

// Refuse answers a request the gateway will not forward: the status, a
// Proxy-Status field with the RFC 9209 error type and details, and the
// details in the body, after "egress denied: " for a refusal (policy,
// guard, budget) or "egress: " for a failure. Both proxies answer
// through it, so that a client reads every refusal alike.
func Refuse(w http.ResponseWriter, status int, errType, details string, refused bool) {
	w.Header().Set("Proxy-Status", ProxyStatus(errType, details))
	prefix := "egress denied: "
	if !refused {
		prefix = "egress: "
	}
	http.Error(w, prefix+details, status)
}

// RefuseJSONRPC answers a refused JSON-RPC message with reply, the
// JSON-RPC errors that say so, with status 200 so that the client's
// session goes on, and the Proxy-Status field of any refusal.
func RefuseJSONRPC(w http.ResponseWriter, details, reply string) {
	w.Header().Set("Proxy-Status", ProxyStatus("http_request_denied", details))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, reply)
}

// ProxyStatus is a Proxy-Status field value: this proxy, the error type,
// and details as a structured-field string (RFC 8941: printable ASCII,
// with quotes and backslashes escaped; anything else becomes '?').
func ProxyStatus(errType, details string) string {
	var b strings.Builder
	b.WriteString(ProxyStatusName + "; error=" + errType + `; details="`)
	for i := 0; i < len(details) && i < 512; i++ {
		switch c := details[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
