package vault

import (
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"slices"
	"strings"
	"text/template"

	"golang.org/x/net/http/httpguts"

	"github.com/agenthold/egress/internal/hostname"
)

// Mode is how a rule puts a secret into requests.
type Mode string

const (
	// Inject sets the rule's header on every matching request, and
	// replaces the placeholder wherever it appears in request headers and
	// the query string.
	Inject Mode = "inject"
	// Login replaces the placeholder only inside the rule's header, and
	// only when the client sent that header; it never adds the header. For
	// account logins, where the harness already sends a credential.
	Login Mode = "login"
	// Refresh is for an OAuth refresh token: Inject never puts it in any
	// request, and a request that carries its placeholder in a header or
	// the query is refused; only the gateway's own refresh grant
	// (FillBody, for mitm's RefreshExchange) sends the value, so that a
	// lenient token server can never hand the sandbox a fresh one.
	Refresh Mode = "refresh"
	// AWSSigV4 is for AWS credentials (the value is
	// ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]): the sandbox signs
	// with the placeholder as its key ID and secret key, and a request to
	// a host the rule names that is signed with the placeholder is
	// re-signed with the real credentials; one signed with any other key
	// is refused. Header, Template and ReplaceIn do not apply.
	AWSSigV4 Mode = "aws-sigv4"
	// GitHubApp is for a GitHub App (the value is a JSON object of its
	// app_id, installation_id and private_key): the gateway mints an
	// installation token, caches it until shortly before it expires, and
	// sets Authorization on requests to the rule's hosts (a bearer token
	// for api.* hosts, basic authentication as x-access-token for git).
	// Header, Template and ReplaceIn do not apply.
	GitHubApp Mode = "github-app"
)

// Places where an inject rule replaces its placeholder in a request.
// Headers and query are the default; the others are opt-in.
const (
	InHeaders    = "header"      // any request header
	InQuery      = "query"       // the query string
	InRuleHeader = "rule-header" // only the rule's own header
	InPath       = "path"        // the URL path (a bot token in /bot<token>/)
	InBody       = "body"        // the body, for the rule's BodyTypes only
	InWebSocket  = "websocket"   // the client's WebSocket text messages
)

// Rule says where a secret may be sent and how.
type Rule struct {
	// Hosts the secret may be sent to: exact names, and "*.example.com"
	// for every subdomain (never the apex), as in policy entries.
	Hosts []string `json:"hosts"`
	// Header is the request header the secret goes in, such as
	// "Authorization"; an inject rule whose ReplaceIn lists only places
	// (no rule-header) may leave it empty and set no header.
	Header string `json:"header"`
	// Template renders the header value from the secret: {{.Value}} is the
	// secret, and base64 encodes a string, as in
	// Basic {{base64 (print "x-access-token:" .Value)}}. Empty means
	// {{.Value}}.
	Template string `json:"template,omitempty"`
	// Paths, if any, limit the rule to URL paths with one of these
	// prefixes, whole segments. A path a server could read as another
	// (with dot segments, empty segments, backslashes or semicolons)
	// matches no limited rule.
	Paths []string `json:"paths,omitempty"`
	// Mode is Inject (the default when empty), Login or Refresh.
	Mode Mode `json:"mode,omitempty"`
	// ReplaceIn says where an Inject rule replaces its placeholder:
	// InHeaders, InQuery, InPath, InBody, InWebSocket, or InRuleHeader
	// alone. Empty means headers and query, as the seed has it; path,
	// body and WebSocket messages are replaced only when listed.
	//
	// Replacing the placeholder wherever the agent writes it lets the
	// agent put the value where it likes on the rule's hosts: a host
	// that stores what it is sent and lets it be read back in pieces (a
	// byte range, a preview) or elsewhere (a web page on another host)
	// discloses it, and responses are redacted only of whole values.
	// List a place only for hosts where nothing sent can be read back.
	ReplaceIn []string `json:"replace_in,omitempty"`
	// BodyTypes are the media types ("application/json") whose bodies an
	// InBody rule replaces in; it must list at least one. Bodies of other
	// types pass unchanged.
	BodyTypes []string `json:"body_types,omitempty"`
}

// compiledRule is a checked rule, ready to match and render.
type compiledRule struct {
	Rule
	hosts []hostname.Pattern
	// Where an inject rule replaces its placeholder.
	inHeaders, inQuery, inPath, inBody, inWebSocket bool
	tmpl                                            *template.Template
	// simple is set for templates of the form "prefix{{.Value}}suffix",
	// which render without text/template.
	simple         bool
	prefix, suffix string
}

var templateFuncs = template.FuncMap{
	"base64": func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
}

// templateData is all a template can see: the value it is given.
type templateData struct{ Value string }

// compile checks a rule: hosts must be valid names or wildcards, the
// header a valid field name, the template must parse, use .Value, and
// render a valid header value.
func (r Rule) compile() (*compiledRule, error) {
	if len(r.Hosts) == 0 {
		return nil, errors.New("vault: rule names no host")
	}
	switch r.Mode {
	case "":
		r.Mode = Inject
	case Inject, Login, Refresh:
	case AWSSigV4, GitHubApp:
		if r.Header != "" || r.Template != "" {
			return nil, fmt.Errorf("vault: a %s rule takes no header or template: it sets Authorization itself", r.Mode)
		}
		r.Header = "Authorization"
	default:
		return nil, fmt.Errorf("vault: unknown mode %q (want inject, login, refresh, aws-sigv4 or github-app)", r.Mode)
	}
	for _, place := range r.ReplaceIn {
		switch {
		case !slices.Contains([]string{InHeaders, InQuery, InRuleHeader, InPath, InBody, InWebSocket}, place):
			return nil, fmt.Errorf("vault: replace_in: unknown place %q (want header, query, path, body, websocket or rule-header)", place)
		case r.Mode != Inject:
			return nil, fmt.Errorf("vault: replace_in is for inject rules (a %s rule has its own)", r.Mode)
		case place == InRuleHeader && len(r.ReplaceIn) > 1:
			return nil, errors.New("vault: replace_in: rule-header stands alone")
		}
	}
	// An inject rule that only replaces its placeholder where the request
	// carries it (replace_in without rule-header) may set no header.
	replaceOnly := r.Mode == Inject && len(r.ReplaceIn) > 0 && !slices.Contains(r.ReplaceIn, InRuleHeader)
	if !(replaceOnly && r.Header == "") && !httpguts.ValidHeaderFieldName(r.Header) {
		return nil, fmt.Errorf("vault: invalid header name %q", r.Header)
	}
	c := &compiledRule{Rule: r, inHeaders: len(r.ReplaceIn) == 0, inQuery: len(r.ReplaceIn) == 0}
	for _, place := range r.ReplaceIn {
		c.inHeaders = c.inHeaders || place == InHeaders
		c.inQuery = c.inQuery || place == InQuery
		c.inPath = c.inPath || place == InPath
		c.inBody = c.inBody || place == InBody
		c.inWebSocket = c.inWebSocket || place == InWebSocket
	}
	switch {
	case c.inBody && len(r.BodyTypes) == 0:
		return nil, errors.New("vault: replace_in body needs body_types, the media types to replace in")
	case !c.inBody && len(r.BodyTypes) > 0:
		return nil, errors.New("vault: body_types without replace_in body")
	}
	for _, t := range r.BodyTypes {
		if mt, _, err := mime.ParseMediaType(t); err != nil || mt != strings.ToLower(t) { // not a name: a media type
			return nil, fmt.Errorf("vault: body_types: %q is not a media type without parameters", t)
		}
	}
	for _, h := range r.Hosts {
		pat, err := parseRuleHost(h)
		if err != nil {
			return nil, err
		}
		c.hosts = append(c.hosts, pat)
	}
	for _, p := range r.Paths {
		if !plainPath(p) {
			return nil, fmt.Errorf("vault: path %q is not a plain absolute path", p)
		}
	}
	text := r.Template
	if text == "" {
		text = "{{.Value}}"
	}
	if !strings.Contains(text, ".Value") {
		return nil, fmt.Errorf("vault: template %q does not use .Value", text)
	}
	t, err := template.New("header").Funcs(templateFuncs).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, fmt.Errorf("vault: template: %w", err)
	}
	c.tmpl = t
	if pre, post, ok := strings.Cut(text, "{{.Value}}"); ok && !strings.Contains(pre+post, "{{") {
		c.simple, c.prefix, c.suffix = true, pre, post
	}
	if _, err := c.render("example-secret-value"); err != nil {
		return nil, err
	}
	return c, nil
}

// checkValue reports whether value is one the rule can use.
func (c *compiledRule) checkValue(value string) error {
	switch c.Mode {
	case AWSSigV4:
		_, err := parseAWSValue(value)
		return err
	case GitHubApp:
		_, err := parseGitHubApp(value)
		return err
	}
	_, err := c.render(value)
	return err
}

// render executes the template with value.
func (c *compiledRule) render(value string) (string, error) {
	var out string
	if c.simple {
		out = c.prefix + value + c.suffix
	} else {
		var b strings.Builder
		if err := c.tmpl.Execute(&b, templateData{Value: value}); err != nil {
			return "", errors.New("vault: template failed") // never the value
		}
		out = b.String()
	}
	if !httpguts.ValidHeaderFieldValue(out) {
		return "", errors.New("vault: rendered header value is not a valid header value")
	}
	return out, nil
}

// parseRuleHost parses one of a rule's hosts: a name or "*.name", as a
// policy's entries name hosts, without a port (a rule applies to every
// port of its hosts).
func parseRuleHost(h string) (hostname.Pattern, error) {
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/@") {
		return hostname.Pattern{}, fmt.Errorf("vault: host %q: hosts are names, not URLs (api.example.com, *.example.com)", h)
	}
	if strings.Contains(h, ":") {
		return hostname.Pattern{}, fmt.Errorf("vault: host %q: hosts take no port (a rule applies to every port of its hosts)", h)
	}
	pat, err := hostname.ParsePattern(h)
	if err != nil {
		return hostname.Pattern{}, fmt.Errorf("vault: host %q: %v", h, err)
	}
	return pat, nil
}

// coversHost reports whether the rule names host (normalised).
func (c *compiledRule) coversHost(h string) bool {
	for _, p := range c.hosts {
		if p.Matches(h) {
			return true
		}
	}
	return false
}

// matches reports whether the rule covers a request to host (normalised)
// and path.
func (c *compiledRule) matches(h, path string) bool {
	if !c.coversHost(h) {
		return false
	}
	if len(c.Paths) == 0 {
		return true
	}
	if !plainPath(path) {
		return false
	}
	for _, p := range c.Paths {
		if pathHasPrefix(path, p) {
			return true
		}
	}
	return false
}

// plainPath reports whether a (decoded) URL path means the same to every
// server: absolute, with no dot or empty segments, and no backslash or
// semicolon, which some servers read as a separator ("/v1/..;/admin").
// Otherwise "/allowed/../elsewhere" would carry a path-limited secret
// outside its paths. A trailing slash is allowed.
func plainPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\;") {
		return false
	}
	for _, seg := range strings.Split(strings.TrimSuffix(p[1:], "/"), "/") {
		if seg == "" && p != "/" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// pathHasPrefix matches whole segments: "/v1" covers "/v1" and "/v1/x",
// not "/v10".
func pathHasPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || strings.HasSuffix(prefix, "/") || path[len(prefix)] == '/'
}

// normalizeHost puts a request's host in the form rules compare: no port,
// and canonical as policy makes names.
func normalizeHost(h string) (string, error) {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	n, err := hostname.Normalize(h)
	if err != nil {
		return "", fmt.Errorf("vault: %w", err)
	}
	return n, nil
}

// hostOf returns a request's host (Host header, else URL).
func hostOf(r *http.Request) string {
	if r.Host != "" {
		return r.Host
	}
	return r.URL.Host
}
