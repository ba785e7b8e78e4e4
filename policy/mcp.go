package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// MCPEndpoint allows an MCP server's Streamable HTTP endpoint, and on it
// the tools an agent may call. Written as an entry:
//
//	mcp https://mcp.example.com/mcp tools=search,fetch
//	mcp https://mcp.example.com/mcp tools=search methods=initialize,tools/list,ping
//
// The endpoint's path may be posted to (JSON-RPC messages), read (the
// server's event stream) and deleted (the session's end); nothing else on
// its host. Each message posted is judged: tools/call by params.name
// against Tools, every other method against Methods
// (DefaultMCPMethods when none is given), responses to the server's own
// requests allowed. A body that is not JSON-RPC 2.0, or a batch with one
// message refused, is refused whole.
type MCPEndpoint struct {
	URL     string   `yaml:"url" json:"url"`
	Tools   []string `yaml:"tools" json:"tools"`
	Methods []string `yaml:"methods" json:"methods,omitempty"`
}

// DefaultMCPMethods are the methods an MCP endpoint allows besides
// tools/call when its entry names none: what a client needs to start a
// session (initialize, or server/discover from protocol 2026-07-28 on)
// and find and call tools.
var DefaultMCPMethods = []string{"server/discover", "initialize", "notifications/initialized", "notifications/cancelled", "ping", "tools/list"}

// MaxMCPBody bounds a message posted to an MCP endpoint: a larger one is
// refused, since it cannot be judged.
const MaxMCPBody = 1 << 20

// Reasons of MCP decisions.
const (
	ReasonMCPTool         = "the MCP tool is not allowed"
	ReasonMCPMethod       = "the MCP method is not allowed"
	ReasonMCPNotJSONRPC   = "the MCP message is not JSON-RPC 2.0"
	ReasonMCPTooLarge     = "the MCP message is larger than the gateway judges"
	ReasonMCPUnread       = "the MCP message could not be read"
	ReasonMCPBodyUnjudged = "a body on a request to an MCP endpoint that is not a POST"
	ReasonMCPUpgrade      = "an MCP endpoint is not upgraded to another protocol"
)

// mcpRule is what an MCP endpoint's request entry allows of the messages
// posted to it.
type mcpRule struct {
	tools, methods []string
}

// parseMCPEntry parses "mcp URL tools=a,b methods=c,d" (entry without
// the "mcp" word).
func parseMCPEntry(s string) (MCPEndpoint, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return MCPEndpoint{}, errors.New("an mcp entry needs the endpoint's URL: mcp https://mcp.example.com/mcp tools=search")
	}
	e := MCPEndpoint{URL: fields[0]}
	for _, f := range fields[1:] {
		key, list, ok := strings.Cut(f, "=")
		var into *[]string
		switch {
		case ok && key == "tools":
			into = &e.Tools
		case ok && key == "methods":
			into = &e.Methods
		default:
			return MCPEndpoint{}, fmt.Errorf("%q: an mcp entry takes tools=a,b and methods=c,d after its URL", f)
		}
		for _, v := range strings.Split(list, ",") {
			if v != "" {
				*into = append(*into, v)
			}
		}
	}
	return e, nil
}

// compileMCP turns an endpoint into the request entry that carries it.
func compileMCP(e MCPEndpoint) (compiledRequest, error) {
	written := "mcp " + e.URL
	fail := func(reason string) (compiledRequest, error) {
		return compiledRequest{}, &EntryError{Entry: written, Reason: reason}
	}
	u, err := url.Parse(e.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fail("the endpoint is an http or https URL with a host and a path, without user, query or fragment")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	host, err := parseEntryText(u.Hostname() + ":" + port)
	if err != nil {
		return fail(err.Error())
	}
	if host.kind != kindName {
		return fail("the endpoint's host must be a name")
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	segs, err := parsePattern(path)
	if err != nil {
		return fail(err.Error())
	}
	if slices.ContainsFunc(segs, func(s string) bool { return s == "*" || s == "**" }) {
		return fail("the endpoint is one path, without * or **")
	}
	methods := e.Methods
	if methods == nil {
		methods = DefaultMCPMethods
	}
	if len(e.Tools) == 0 {
		return fail("an mcp entry names the tools it allows: tools=search,fetch")
	}
	host.rule.text, host.rule.requestsOnly = written, true
	return compiledRequest{host: host, segments: segs, rule: &requestRule{
		text:    written,
		methods: methodSet{known: methodBit("GET") | methodBit("POST") | methodBit("DELETE")},
		ports:   host.rule.ports,
		mcp:     &mcpRule{tools: slices.Clone(e.Tools), methods: slices.Clone(methods)},
	}}, nil
}

// DecideHTTP judges one HTTP request whose Host names host on port: by
// its method and path (DecideRequest), by the method it may ask an
// upstream to take instead (X-HTTP-Method-Override and the like, and a
// _method query parameter), and, posted to an MCP endpoint, by its
// JSON-RPC messages. To judge those it reads the body (up to
// MaxMCPBody) and puts back what it read, so that r can be forwarded as
// it came. It is the one place a proxy judges a request: tproxy's plain
// HTTP and mitm's intercepted requests both call it.
func (p *Policy) DecideHTTP(r *http.Request, host string, port uint16) Decision {
	d := p.DecideRequest(host, port, r.Method, r.URL.EscapedPath())
	rule := d.mcp
	d.mcp = nil
	if d.Allowed && !d.Report && d.Requests {
		// A method an upstream may take in place of the request's own
		// (Rails, Laravel, Google's APIs): the request must be allowed as
		// that method too.
		for _, m := range overrideMethods(r) {
			if o := p.DecideRequest(host, port, m, r.URL.EscapedPath()); !o.Allowed || o.Report {
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
	if r.Header.Get("Upgrade") != "" {
		// A WebSocket (or any protocol) on the endpoint would carry
		// messages no judge reads.
		return deny(ReasonMCPUpgrade)
	}
	if r.Method != http.MethodPost {
		// The event stream and the session's end carry no message: a
		// body there is one no judge has read, whatever a server does
		// with it.
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			return deny(ReasonMCPBodyUnjudged)
		}
		return d
	}
	if r.Body == nil || r.Body == http.NoBody {
		return deny(ReasonMCPNotJSONRPC)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxMCPBody+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	switch {
	case err != nil:
		return deny(ReasonMCPUnread)
	case len(body) > MaxMCPBody:
		return deny(ReasonMCPTooLarge)
	}
	tools, why := rule.judge(body)
	d.Tool = strings.Join(tools, ",")
	if why != "" {
		refused := deny(why)
		if !refused.Allowed {
			refused.JSONRPCReply = rpcRefusal(body, why)
		}
		return refused
	}
	return d
}

// MCPErrorCode is the JSON-RPC error code of a message the gateway
// refused: in the range JSON-RPC leaves to servers.
const MCPErrorCode = -32001

// rpcRefusal is the JSON-RPC answer to a refused body: an error for each
// request in it (notifications and responses get none), in the body's
// shape (one object, or an array for a batch); "" when it has no request
// to answer, or is not JSON-RPC.
func rpcRefusal(body []byte, reason string) string {
	body = bytes.TrimSpace(body)
	// A fresh slice to unmarshal into: json.RawMessage reuses what it is
	// given, and body is what goes on to the server.
	var messages []json.RawMessage
	batch := len(body) > 0 && body[0] == '['
	if !batch {
		messages = []json.RawMessage{body}
	} else if json.Unmarshal(body, &messages) != nil {
		return ""
	}
	type rpcError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	type reply struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}
	var replies []reply
	for _, raw := range messages {
		msg, ok := exactObject(raw, messageKeys...)
		if !ok {
			return ""
		}
		_, isCall := msg["method"]
		if id, ok := msg["id"]; ok && isCall {
			replies = append(replies, reply{JSONRPC: "2.0", ID: id, Error: rpcError{Code: MCPErrorCode, Message: "egress denied: " + reason}})
		}
	}
	var out []byte
	switch {
	case len(replies) == 0:
		return ""
	case batch:
		out, _ = json.Marshal(replies)
	default:
		out, _ = json.Marshal(replies[0])
	}
	return string(out)
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

// judge judges a body of JSON-RPC messages: the tools it calls, and why
// it is refused, or "".
func (m *mcpRule) judge(body []byte) ([]string, string) {
	body = bytes.TrimSpace(body)
	var messages []json.RawMessage
	if len(body) > 0 && body[0] == '[' {
		if err := json.Unmarshal(body, &messages); err != nil || len(messages) == 0 {
			return nil, ReasonMCPNotJSONRPC
		}
	} else {
		messages = []json.RawMessage{body}
	}
	var tools []string
	for _, raw := range messages {
		tool, why := m.judgeMessage(raw)
		if tool != "" {
			tools = append(tools, tool)
		}
		if why != "" {
			return tools, why
		}
	}
	return tools, ""
}

// messageKeys are a JSON-RPC message's members.
var messageKeys = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// judgeMessage judges one message. Its keys are read exactly as written
// and once each: a second "params", or a "Params" beside it, could be
// what the server reads.
func (m *mcpRule) judgeMessage(raw json.RawMessage) (string, string) {
	msg, ok := exactObject(raw, messageKeys...)
	if !ok || string(msg["jsonrpc"]) != `"2.0"` {
		return "", ReasonMCPNotJSONRPC
	}
	methodRaw, isCall := msg["method"]
	if !isCall {
		// A response to the server's own request (sampling, roots).
		_, result := msg["result"]
		_, rpcErr := msg["error"]
		if _, id := msg["id"]; id && result != rpcErr {
			return "", ""
		}
		return "", ReasonMCPNotJSONRPC
	}
	var method string
	if json.Unmarshal(methodRaw, &method) != nil {
		return "", ReasonMCPNotJSONRPC
	}
	if method != "tools/call" {
		if slices.Contains(m.methods, method) {
			return "", ""
		}
		return "", ReasonMCPMethod
	}
	params, ok := exactObject(msg["params"], "name", "arguments")
	if !ok {
		return "", ReasonMCPNotJSONRPC
	}
	var name string
	if json.Unmarshal(params["name"], &name) != nil || name == "" {
		return "", ReasonMCPNotJSONRPC
	}
	if !slices.Contains(m.tools, name) {
		return name, ReasonMCPTool
	}
	return name, ""
}

// exactObject reads a JSON object's members by their exact keys, and
// fails on anything else: a key written twice, keys that differ only in
// case, a key that is not ASCII (encoding/json, which some servers decode
// with, folds "ſ" into "s" and "K" into "k"), and a key that differs from
// one of known only in case ("Method", which such a server reads as
// "method" though no "method" is there).
func exactObject(raw json.RawMessage, known ...string) (map[string]json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	out := map[string]json.RawMessage{}
	folded := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		key, isKey := t.(string)
		if err != nil || !isKey || !isASCII(key) {
			return nil, false
		}
		lower := strings.ToLower(key) // not a name: a JSON key
		if folded[lower] {
			return nil, false
		}
		for _, k := range known {
			if lower == k && key != k {
				return nil, false
			}
		}
		folded[lower] = true
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return nil, false
		}
		out[key] = v
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // something after the object
	}
	return out, true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
