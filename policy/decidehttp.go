package policy

import (
	"bytes"
	"io"
	"mime"
	"net/http"
	"strings"
)

// ReasonMCPNotRead says that a request judged again is now on an MCP
// endpoint, whose messages were not read when it came: they cannot be
// judged, so the request is refused.
const ReasonMCPNotRead = "the request's MCP messages were not read when it was judged"

// ReasonNotJudged is DecideAgain's reason for a Decision DecideHTTP did
// not make.
const ReasonNotJudged = "the request was never judged by DecideHTTP"

// DecideHTTP judges one HTTP request whose Host names host on port: by
// its method and path (DecideRequest), by the method it may ask an
// upstream to take instead (X-HTTP-Method-Override and the like, and a
// _method query parameter), and, posted to an MCP endpoint, by its
// JSON-RPC messages. To judge those it reads the body (up to
// MaxMCPBody) and puts back what it read, so that r can be forwarded as
// it came. It is the one place a proxy judges a request: tproxy's plain
// HTTP and mitm's intercepted requests both call it, and DecideAgain
// judges by the same code what it read.
func (p *Policy) DecideHTTP(r *http.Request, host string, port uint16) Decision {
	req := readRequest(r, host, port)
	var body []byte
	d := p.judgeRequest(req, func() { body = req.readBody(r) })
	switch d.Reason {
	case ReasonMCPTool, ReasonMCPMethod, ReasonMCPNotJSONRPC:
		if !d.Allowed && body != nil {
			d.JSONRPCReply = rpcRefusal(body, d.Reason)
		}
	}
	d.request = req
	return d
}

// DecideAgain judges by p the request d was DecideHTTP's decision of, as
// DecideHTTP read it then: so that a policy change ends a request being
// forwarded (a stream, a long tools/call) that the new policy refuses,
// by its host, method, path, override methods and MCP messages alike. A
// request on what is now an MCP endpoint, whose messages were not read
// when it came, is refused (ReasonMCPNotRead), as is a Decision
// DecideHTTP did not make. Its Decision can be judged again in turn.
func (p *Policy) DecideAgain(d Decision) Decision {
	switch {
	case p == nil:
		return Decision{Reason: ReasonNoPolicy}
	case d.request == nil:
		return Decision{Reason: ReasonNotJudged}
	}
	again := p.judgeRequest(d.request, nil)
	again.request = d.request
	return again
}

// judgedRequest is what DecideHTTP reads of a request: all that judging
// it needs, kept so that DecideAgain can judge it again once its body has
// gone on.
type judgedRequest struct {
	host         string
	port         uint16
	method, path string
	overrides    []string // overrideMethods
	upgrade      bool     // it asks for another protocol
	body         bool     // it has a body
	bodyOffPost  bool     // a body on a request that is not a POST
	encoded      bool     // its body's bytes may not be what a server reads (encodedBody)
	read         bool     // the body was read for its messages: bodyWhy or messages
	bodyWhy      string   // why the body read cannot be judged, if it cannot
	messages     []rpcMessage
}

func readRequest(r *http.Request, host string, port uint16) *judgedRequest {
	body := r.Body != nil && r.Body != http.NoBody
	return &judgedRequest{
		host: host, port: port, method: r.Method, path: r.URL.EscapedPath(),
		overrides: overrideMethods(r),
		upgrade:   r.Header.Get("Upgrade") != "",
		encoded:   encodedBody(r.Header),
		body:      body, bodyOffPost: body && r.ContentLength != 0,
	}
}

// encodedBody says whether a server may read other JSON than the
// judge from a body with header h: one in a content coding (body-parser,
// the TypeScript SDK's, inflates gzip, deflate, br and zstd), or in a
// charset other than UTF-8 (it decodes UTF-7 too, in which plain ASCII
// bytes the judge reads as a string's contents spell JSON of their own),
// or whose type cannot be read at all.
func encodedBody(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") { // not a name: a content coding
				return true
			}
		}
	}
	types := h.Values("Content-Type")
	switch {
	case len(types) == 0:
		return false // JSON is UTF-8 (RFC 8259)
	case len(types) > 1:
		return true
	}
	_, params, err := mime.ParseMediaType(types[0])
	if err != nil {
		return true
	}
	charset, ok := params["charset"]
	return ok && !strings.EqualFold(charset, "utf-8") && !strings.EqualFold(charset, "utf8") // not a name: a charset
}

// readBody reads r's body (up to MaxMCPBody) for its messages, puts back
// what it read, and returns it.
func (req *judgedRequest) readBody(r *http.Request) []byte {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxMCPBody+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	req.read = true
	switch {
	case err != nil:
		req.bodyWhy = ReasonMCPUnread
	case len(body) > MaxMCPBody:
		req.bodyWhy = ReasonMCPTooLarge
	default:
		req.messages = readMessages(body)
	}
	return body
}

// judgeRequest judges req by p. read reads its body the first time it is
// judged; judged again (read nil), the messages read then are judged.
func (p *Policy) judgeRequest(req *judgedRequest, read func()) Decision {
	d := p.DecideRequest(req.host, req.port, req.method, req.path)
	rule := d.mcp
	d.mcp = nil
	if d.Allowed && !d.Report && d.Requests {
		// A method an upstream may take in place of the request's own
		// (Rails, Laravel, Google's APIs): the request must be allowed as
		// that method too.
		for _, m := range req.overrides {
			if o := p.DecideRequest(req.host, req.port, m, req.path); !o.Allowed || o.Report {
				o.mcp = nil
				return o
			}
		}
	}
	if rule == nil || !d.Allowed {
		return d
	}
	deny := func(why string) Decision {
		return p.finish(Decision{Name: d.Name, Rule: d.Rule, Reason: why, Tool: d.Tool, Requests: true})
	}
	switch {
	case req.upgrade:
		// A WebSocket (or any protocol) on the endpoint would carry
		// messages no judge reads.
		return deny(ReasonMCPUpgrade)
	case req.method != http.MethodPost && req.bodyOffPost:
		// The event stream and the session's end carry no message: a
		// body there is one no judge has read, whatever a server does
		// with it.
		return deny(ReasonMCPBodyUnjudged)
	case req.method != http.MethodPost:
		return d
	case !req.body:
		return deny(ReasonMCPNotJSONRPC)
	case req.encoded:
		return deny(ReasonMCPEncoded)
	case !req.read && read == nil:
		return deny(ReasonMCPNotRead)
	case !req.read:
		read()
	}
	if req.bodyWhy != "" {
		return deny(req.bodyWhy)
	}
	tools, why := rule.judge(req.messages)
	d.Tool = strings.Join(tools, ",")
	if why != "" {
		return deny(why)
	}
	return d
}

// overrideHeaders carry a method that some upstreams take in place of
// the request's.
var overrideHeaders = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// overrideMethods are the methods a request asks an upstream to take in
// place of its own: the override headers' and the _method query
// parameter's. Rails and Laravel also read _method from a form body,
// which is not read here: on such an upstream, a POST entry allows what
// the form says.
func overrideMethods(r *http.Request) []string {
	var out []string
	for _, h := range overrideHeaders {
		out = append(out, r.Header.Values(h)...)
	}
	if r.URL != nil && strings.Contains(r.URL.RawQuery, "_method") {
		out = append(out, r.URL.Query()["_method"]...)
	}
	for i, m := range out {
		out[i] = strings.ToUpper(strings.TrimSpace(m)) // not a name: a method
	}
	return out
}
