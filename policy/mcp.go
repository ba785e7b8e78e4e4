package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// message refused, is refused whole, and so is one in a content coding
// or a charset other than UTF-8, in which a server may read other
// messages from the same bytes. The endpoint is found as a deny entry is:
// its path in any letter case, with encoded slashes read either way.
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
	ReasonMCPEncoded      = "the MCP message is not in UTF-8 without a content coding"
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

// rpcMessage is what judging needs of one JSON-RPC message posted to
// an MCP endpoint, read once (readMessages) so that the request it came
// in can be judged again after its body has gone on.
type rpcMessage struct {
	method string // "" for a response to the server's own request
	tool   string // a tools/call's params.name
	bad    bool   // not a JSON-RPC 2.0 message
}

// readMessages reads a body of JSON-RPC messages, one or a batch, as far
// as the first that is not one (bad, and last). A message like one
// before it (the same method and tool) is judged as that one is, so it
// is kept once: what a request being forwarded holds for DecideAgain is
// bounded by the methods and tools it names, not by its body's size.
func readMessages(body []byte) []rpcMessage {
	body = bytes.TrimSpace(body)
	var raws []json.RawMessage
	if len(body) > 0 && body[0] == '[' {
		if err := json.Unmarshal(body, &raws); err != nil || len(raws) == 0 {
			return []rpcMessage{{bad: true}}
		}
	} else {
		raws = []json.RawMessage{body}
	}
	var out []rpcMessage
	seen := map[rpcMessage]bool{}
	for _, raw := range raws {
		m := readMessage(raw)
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
		if m.bad {
			break
		}
	}
	return out
}

// messageKeys are a JSON-RPC message's members.
var messageKeys = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// readMessage reads one message. Its keys are read exactly as written
// and once each: a second "params", or a "Params" beside it, could be
// what the server reads.
func readMessage(raw json.RawMessage) rpcMessage {
	bad := rpcMessage{bad: true}
	msg, ok := exactObject(raw, messageKeys...)
	if !ok || string(msg["jsonrpc"]) != `"2.0"` {
		return bad
	}
	methodRaw, isCall := msg["method"]
	if !isCall {
		// A response to the server's own request (sampling, roots).
		_, result := msg["result"]
		_, rpcErr := msg["error"]
		if _, id := msg["id"]; id && result != rpcErr {
			return rpcMessage{}
		}
		return bad
	}
	var method string
	if json.Unmarshal(methodRaw, &method) != nil || method == "" {
		return bad
	}
	if method != "tools/call" {
		return rpcMessage{method: method}
	}
	params, ok := exactObject(msg["params"], "name", "arguments")
	if !ok {
		return bad
	}
	var name string
	if json.Unmarshal(params["name"], &name) != nil || name == "" {
		return bad
	}
	return rpcMessage{method: method, tool: name}
}

// judge judges messages in order: the tools they call, as far as the
// first refused, and why that one is refused, or "".
func (m *mcpRule) judge(messages []rpcMessage) ([]string, string) {
	var tools []string
	for _, msg := range messages {
		switch {
		case msg.bad:
			return tools, ReasonMCPNotJSONRPC
		case msg.method == "": // a response
		case msg.method != "tools/call":
			if !slices.Contains(m.methods, msg.method) {
				return tools, ReasonMCPMethod
			}
		default:
			tools = append(tools, msg.tool)
			if !slices.Contains(m.tools, msg.tool) {
				return tools, ReasonMCPTool
			}
		}
	}
	return tools, ""
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
