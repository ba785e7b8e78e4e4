//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/agenthold/egress/examples/netns"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agenthold/egress/mitm"
)

// The demo's stand-ins for real services. They live in a namespace of
// their own, on 198.18.0.0/15, with certificates from a root made for the
// demo: nothing leaves the machine.
const (
	demoAnthropicKey = "sk-ant-demo-9b1f0c3e7a5d2468"  // what the fake API checks
	demoGitHubToken  = "ghp_demo_4c2e8a6f0b1d3957e7a9" // what the fake git server checks
	internetDNS      = "198.18.0.1"
)

// fakeHosts maps the demo's names to their addresses on the fake internet.
var fakeHosts = map[string]string{
	"api.anthropic.com.":      "198.18.10.1",
	"github.com.":             "198.18.10.2",
	"registry.npmjs.org.":     "198.18.10.3",
	"npmjs.org.":              "198.18.10.3",
	"www.example.com.":        "198.18.10.4",
	"ssh.example.net.":        "198.18.10.5",
	"evil.example.org.":       "198.18.10.6",
	"echo.example.com.":       "198.18.10.7",
	"slow.example.com.":       "198.18.10.8",
	"pypi.org.":               "198.18.10.9",
	"files.pythonhosted.org.": "198.18.10.9",
	"mcp.example.com.":        "198.18.10.10",
}

// slowZone is a domain whose authoritative server takes slowDNSDelay to
// answer (NXDOMAIN) any name: what a hostile agent would run to hold a
// resolver's queries open.
const (
	slowZone     = ".slow.example.net."
	slowDNSDelay = 1500 * time.Millisecond
	slowHTTP     = 2 * time.Second // slow.example.com's time to answer
)

// internet is the fake internet: a namespace with an authoritative DNS
// server and the services, served by this process.
type internet struct {
	ns       *netns.NS
	root     *mitm.CA // the demo's stand-in for the public web PKI
	rootFile string
	closers  []io.Closer
	services map[string]io.Closer // by name, to stop one
}

// startInternet serves the fake internet inside ns (already wired).
func startInternet(ns *netns.NS, dir string) (*internet, error) {
	root, err := mitm.NewCA("Demo Public Root")
	if err != nil {
		return nil, err
	}
	in := &internet{ns: ns, root: root, rootFile: filepath.Join(dir, "demo-public-root.pem"), services: map[string]io.Closer{}}
	if err := os.WriteFile(in.rootFile, root.PEM(), 0o644); err != nil {
		return nil, err
	}
	added := map[string]bool{}
	for _, a := range fakeHosts {
		if added[a] {
			continue
		}
		added[a] = true
		if err := ns.IP("addr", "add", a+"/32", "dev", "lo"); err != nil {
			return nil, err
		}
	}
	leaves := &mitm.Leaves{CA: root}
	gitRoot, err := makeGitRepo(dir)
	if err != nil {
		return nil, err
	}
	// Sockets are made on the namespace's thread; they serve from any.
	err = ns.Do(func() error {
		if err := in.serveDNS(); err != nil {
			return err
		}
		services := []struct {
			addr, name string
			h          http.Handler
		}{
			{"198.18.10.1:443", "api.anthropic.com", http.HandlerFunc(fakeAnthropic)},
			{"198.18.10.2:443", "github.com", fakeGit(gitRoot)},
			{"198.18.10.3:443", "registry.npmjs.org", http.HandlerFunc(fakeRegistry)},
			{"198.18.10.6:443", "evil.example.org", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "you reached evil.example.org") })},
			{"198.18.10.7:443", "echo.example.com", http.HandlerFunc(fakeEcho)},
			{"198.18.10.8:443", "slow.example.com", http.HandlerFunc(fakeSlow)},
			{"198.18.10.9:443", "pypi.org", http.HandlerFunc(fakePyPI)},
			{"198.18.10.10:443", "mcp.example.com", fakeMCP()},
		}
		for _, s := range services {
			ln, err := net.Listen("tcp", s.addr)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: wholeBody(s.h), ErrorLog: log.New(io.Discard, "", 0), TLSConfig: &tls.Config{
				GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return leaves.Get(h.ServerName) },
			}}
			go srv.ServeTLS(ln, "", "")
			in.closers = append(in.closers, srv)
			in.services[s.name] = srv
		}
		for addr, h := range map[string]http.HandlerFunc{
			"198.18.10.4:80": func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "Example Domain, served over plain HTTP to %s\n", r.Host)
			},
			"198.18.10.8:80": fakeSlow,
		} {
			plain, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: wholeBody(h), ErrorLog: log.New(io.Discard, "", 0)}
			go srv.Serve(plain)
			in.closers = append(in.closers, srv)
		}
		banner, err := net.Listen("tcp", "198.18.10.5:22")
		if err != nil {
			return err
		}
		in.closers = append(in.closers, banner)
		go func() {
			for {
				c, err := banner.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.Write([]byte("SSH-2.0-OpenSSH_9.6 demo\r\n"))
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					io.Copy(io.Discard, c)
				}()
			}
		}()
		return nil
	})
	if err != nil {
		in.close()
		return nil, err
	}
	return in, nil
}

func (in *internet) close() {
	for _, c := range in.closers {
		c.Close()
	}
}

// serveDNS answers for the fake names, and NXDOMAIN for the rest (slowly,
// under slowZone).
func (in *internet) serveDNS() error {
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		q := r.Question[0]
		if strings.HasSuffix(strings.ToLower(q.Name), slowZone) {
			time.Sleep(slowDNSDelay)
		}
		addr, ok := fakeHosts[strings.ToLower(q.Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		} else if q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 300 IN A %s", q.Name, addr))
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", internetDNS+":53")
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", internetDNS+":53")
	if err != nil {
		pc.Close()
		return err
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		in.closers = append(in.closers, closerFunc(srv.Shutdown))
	}
	return nil
}

// maxFakeBody bounds what a fake service reads of a request body.
const maxFakeBody = 8 << 20

// wholeBody reads a request's body before h answers, as real services
// do: a server that answers an HTTP/2 request before reading its body
// resets the stream, and the client then reports a framing error
// instead of the answer.
func wholeBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxFakeBody))
		if err != nil {
			http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// fakeAnthropic streams a Messages API answer as server-sent events, for
// the right key only.
func fakeAnthropic(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("x-api-key")), []byte(demoAnthropicKey)) != 1 {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintln(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`)
		return
	}
	if r.URL.Path == "/v1/models" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"data":[{"id":"demo-model"}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flush := http.NewResponseController(w).Flush
	events := []string{
		`event: message_start` + "\n" + `data: {"type":"message_start"}`,
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","delta":{"text":"Hello from "}}`,
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","delta":{"text":"the fake API"}}`,
		`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
	}
	for _, e := range events {
		fmt.Fprintf(w, "%s\n\n", e)
		flush()
		time.Sleep(20 * time.Millisecond) // a token stream arrives piece by piece
	}
}

// fakeGit serves a git repository over smart HTTP with git http-backend,
// for requests with the right token only, which may clone and push (the
// token's user is http-backend's REMOTE_USER, which enables pushing).
func fakeGit(root string) http.Handler {
	backend := &cgi.Handler{Path: gitPath(), Args: []string{"http-backend"}, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=x-access-token"}}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+demoGitHubToken))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(want)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="GitHub"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})
}

func gitPath() string {
	if p, err := exec.LookPath("git"); err == nil {
		return p
	}
	return "git"
}

// makeGitRepo creates demo/hello.git with one commit.
func makeGitRepo(dir string) (string, error) {
	root := filepath.Join(dir, "git")
	work := filepath.Join(dir, "hello-work")
	bare := filepath.Join(root, "demo", "hello.git")
	if _, err := exec.LookPath("git"); err != nil {
		return root, nil // the demo reports git as missing
	}
	steps := [][]string{
		{"init", "-q", "--bare", bare},
		{"init", "-q", work},
		{"-C", work, "-c", "user.name=demo", "-c", "user.email=demo@example.com", "commit", "-q", "--allow-empty", "-m", "initial"},
	}
	if err := os.MkdirAll(filepath.Dir(bare), 0o755); err != nil {
		return "", err
	}
	for i, s := range steps {
		if i == 2 {
			if err := os.WriteFile(filepath.Join(work, "README.md"), []byte("Hello from a repository cloned through agenthold.\n"), 0o644); err != nil {
				return "", err
			}
			if out, err := exec.Command("git", "-C", work, "add", "README.md").CombinedOutput(); err != nil {
				return "", fmt.Errorf("git add: %v: %s", err, out)
			}
		}
		if out, err := exec.Command("git", s...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %s: %v: %s", s[0], err, out)
		}
	}
	if out, err := exec.Command("git", "-C", work, "push", "-q", bare, "HEAD:refs/heads/main").CombinedOutput(); err != nil {
		return "", fmt.Errorf("git push: %v: %s", err, out)
	}
	if out, err := exec.Command("git", "-C", bare, "symbolic-ref", "HEAD", "refs/heads/main").CombinedOutput(); err != nil {
		return "", fmt.Errorf("git symbolic-ref: %v: %s", err, out)
	}
	return root, nil
}

// fakeMCP is an MCP server (the official SDK's, Streamable HTTP at /mcp)
// with two tools: search, and exec, which an agent's policy would rather
// it did not call.
func fakeMCP() http.Handler {
	s := mcp.NewServer(&mcp.Implementation{Name: "demo-tools", Version: "1"}, nil)
	type args struct {
		Query string `json:"query"`
	}
	for _, name := range []string{"search", "exec"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: "the demo's " + name}, func(_ context.Context, _ *mcp.CallToolRequest, in args) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + " ran " + in.Query}}}, nil, nil
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	return mux
}

// fakeEcho answers with the request's headers: the kind of service the
// seed warns about, which would show an injected value to the agent.
func fakeEcho(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	for _, k := range []string{"Authorization", "X-Api-Key"} {
		if v := r.Header.Get(k); v != "" {
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
	}
}

// fakeSlow takes slowHTTP to answer, or until the client gives up.
func fakeSlow(w http.ResponseWriter, r *http.Request) {
	select {
	case <-time.After(slowHTTP):
		fmt.Fprintln(w, "slow answer")
	case <-r.Context().Done():
	}
}
