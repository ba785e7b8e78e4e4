package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/vault"
)

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// newFlags returns a flag set whose errors are usage errors.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

func parse(fs *flag.FlagSet, args []string, positional int) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			fmt.Print(usageText)
			os.Exit(exitOK)
		}
		return nil, usagef("%s: %v", fs.Name(), err)
	}
	rest := fs.Args()
	// Allow flags after positional arguments too.
	var pos []string
	for len(rest) > 0 && len(pos) < positional {
		pos = append(pos, rest[0])
		if err := fs.Parse(rest[1:]); err != nil {
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		rest = fs.Args()
	}
	if len(pos) != positional || len(rest) != 0 {
		return nil, usagef("%s takes %d argument(s)", fs.Name(), positional)
	}
	return pos, nil
}

func cmdServe(args []string) error {
	fs := newFlags("serve")
	config := fs.String("config", "", "configuration file")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := startServer(ctx, cfg, logger)
	if err != nil {
		return err
	}
	logger.Info("agenthold serving", "admin_socket", cfg.adminSocket(), "proxy_port", cfg.Egress.ProxyPort,
		"explicit_port", cfg.Egress.ExplicitPort, "dns_port", cfg.Egress.DNSPort, "egress_disabled", cfg.Egress.Disabled)
	fmt.Println("agenthold: ready") // for scripts that wait
	<-ctx.Done()
	logger.Info("agenthold stopping: draining, then removing namespaces, links and rules")
	drain, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	s.stop(drain)
	return nil
}

// client talks to the admin socket.
type client struct {
	http *http.Client
}

func newClient(socket string) *client {
	if socket == "" {
		socket = os.Getenv("AGENTHOLD_SOCKET")
	}
	if socket == "" {
		def := defaultConfig()
		socket = def.adminSocket()
	}
	return &client{http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}}
}

// do sends a request and decodes a JSON answer into out (if not nil).
func (c *client) do(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://agenthold"+path, rd)
	resp, err := c.http.Do(req)
	if err != nil {
		return unreachableError{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		if e.Error == "" {
			e.Error = resp.Status
		}
		return fmt.Errorf("%s", e.Error)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// cmdAdmin runs the commands that talk to the server.
func cmdAdmin(cmd string, args []string) error {
	fs := newFlags(cmd)
	socket := fs.String("socket", "", "admin socket")
	switch cmd {
	case "agent create":
		mode := fs.String("mode", "open", "open or allowlist")
		var allow stringList
		fs.Var(&allow, "allow", "allow entry")
		private := fs.Bool("allow-private", false, "allow private networks")
		ns := fs.String("netns", "", "adopt this network namespace")
		pos, err := parse(fs, args, 1)
		if err != nil {
			return err
		}
		var info AgentInfo
		spec := AgentSpec{Name: pos[0], NetNS: *ns, Policy: PolicySpec{Mode: *mode, Allow: allow, AllowPrivateNetworks: *private}}
		if err := newClient(*socket).do("POST", "/v1/agents", spec, &info); err != nil {
			return err
		}
		fmt.Printf("agent %s: sandbox %s (%s), namespace %s\n", info.Name, info.Sandbox4, info.Sandbox6, info.NetNS)
		return nil
	case "agent list":
		asJSON := fs.Bool("json", false, "JSON")
		if _, err := parse(fs, args, 0); err != nil {
			return err
		}
		var list []AgentInfo
		if err := newClient(*socket).do("GET", "/v1/agents", nil, &list); err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(os.Stdout).Encode(list)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tPOLICY\tSANDBOX\tNAMESPACE\tSECRETS")
		for _, a := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Name, policyText(a.Policy), a.Sandbox4, a.NetNS, strings.Join(a.Secrets, ", "))
		}
		return tw.Flush()
	case "agent delete":
		pos, err := parse(fs, args, 1)
		if err != nil {
			return err
		}
		return newClient(*socket).do("DELETE", "/v1/agents/"+url.PathEscape(pos[0]), nil, nil)
	case "policy show":
		pos, err := parse(fs, args, 1)
		if err != nil {
			return err
		}
		var p PolicySpec
		if err := newClient(*socket).do("GET", "/v1/agents/"+url.PathEscape(pos[0])+"/policy", nil, &p); err != nil {
			return err
		}
		fmt.Println(policyText(p))
		return nil
	case "policy set":
		mode := fs.String("mode", "allowlist", "open or allowlist")
		var allow stringList
		fs.Var(&allow, "allow", "allow entry")
		private := fs.Bool("allow-private", false, "allow private networks")
		pos, err := parse(fs, args, 1)
		if err != nil {
			return err
		}
		return newClient(*socket).do("PUT", "/v1/agents/"+url.PathEscape(pos[0])+"/policy", PolicySpec{Mode: *mode, Allow: allow, AllowPrivateNetworks: *private}, nil)
	case "secret put":
		return secretPut(fs, socket, args)
	case "secret list":
		asJSON := fs.Bool("json", false, "JSON")
		if _, err := parse(fs, args, 0); err != nil {
			return err
		}
		var list []vault.Info
		if err := newClient(*socket).do("GET", "/v1/secrets", nil, &list); err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(os.Stdout).Encode(list)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tHOSTS\tHEADER\tMODE\tUPDATED")
		for _, s := range list {
			mode := string(s.Rule.Mode)
			if mode == "" {
				mode = string(vault.Inject)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, strings.Join(s.Rule.Hosts, ","), s.Rule.Header, mode, s.Updated.Format(time.RFC3339))
		}
		return tw.Flush()
	case "secret delete":
		pos, err := parse(fs, args, 1)
		if err != nil {
			return err
		}
		return newClient(*socket).do("DELETE", "/v1/secrets/"+url.PathEscape(pos[0]), nil, nil)
	case "secret attach":
		env := fs.String("env", "", "environment variable")
		pos, err := parse(fs, args, 2)
		if err != nil {
			return err
		}
		if *env == "" {
			return usagef("secret attach needs --env VAR")
		}
		if err := newClient(*socket).do("POST", "/v1/agents/"+url.PathEscape(pos[0])+"/secrets", AttachRequest{Secret: pos[1], Env: *env}, nil); err != nil {
			return err
		}
		fmt.Printf("%s: $%s now holds a placeholder for %s\n", pos[0], *env, pos[1])
		return nil
	case "secret detach":
		pos, err := parse(fs, args, 2)
		if err != nil {
			return err
		}
		return newClient(*socket).do("DELETE", "/v1/agents/"+url.PathEscape(pos[0])+"/secrets/"+url.PathEscape(pos[1]), nil, nil)
	case "exec":
		return execIn(fs, socket, args)
	case "log":
		return readLog(fs, socket, args)
	case "metrics":
		if _, err := parse(fs, args, 0); err != nil {
			return err
		}
		resp, err := newClient(*socket).http.Get("http://agenthold/metrics")
		if err != nil {
			return unreachableError{err}
		}
		defer resp.Body.Close()
		_, err = io.Copy(os.Stdout, resp.Body)
		return err
	}
	return usagef("unknown command %q", cmd)
}

func policyText(p PolicySpec) string {
	mode := p.Mode
	if mode == "" {
		mode = "open"
	}
	s := mode
	if len(p.Allow) > 0 {
		s += " " + strings.Join(p.Allow, " ")
	}
	if p.AllowPrivateNetworks {
		s += " +private"
	}
	return s
}

// secretPut reads the value from stdin or a file, never an argument, so
// that it stays out of shell history and process listings.
func secretPut(fs *flag.FlagSet, socket *string, args []string) error {
	preset := fs.String("preset", "", "preset rule")
	var hosts, paths stringList
	fs.Var(&hosts, "host", "host the secret may go to")
	fs.Var(&paths, "path", "URL path prefix")
	header := fs.String("header", "", "header to set")
	tmpl := fs.String("template", "", "header value template")
	login := fs.Bool("login", false, "login mode")
	fromFile := fs.String("from-file", "", "read the value from this file")
	owner := fs.String("owner", "", "owner")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	req := SecretPut{Preset: *preset, Owner: *owner}
	if *preset == "" {
		if len(hosts) == 0 || *header == "" {
			return usagef("secret put needs --preset, or --host and --header")
		}
		r := vault.Rule{Hosts: hosts, Header: *header, Template: *tmpl, Paths: paths}
		if *login {
			r.Mode = vault.Login
		}
		req.Rule = &r
	}
	var in io.Reader = os.Stdin
	if *fromFile != "" {
		f, err := os.Open(*fromFile)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	value, err := io.ReadAll(io.LimitReader(in, 64<<10))
	if err != nil {
		return err
	}
	req.Value = strings.TrimRight(string(value), "\r\n")
	if req.Value == "" {
		return usagef("no value: pipe it on stdin or give --from-file")
	}
	if err := newClient(*socket).do("PUT", "/v1/secrets/"+url.PathEscape(pos[0]), req, nil); err != nil {
		return err
	}
	fmt.Printf("secret %s stored\n", pos[0])
	return nil
}

// execIn runs a command in an agent's sandbox: its network namespace
// (through `ip netns exec`, which also gives it the sandbox's
// resolv.conf) and its environment.
func execIn(fs *flag.FlagSet, socket *string, args []string) error {
	dash := -1
	for i, a := range args {
		if a == "--" {
			dash = i
			break
		}
	}
	if dash < 0 || dash == len(args)-1 {
		return usagef("exec AGENT -- COMMAND [ARG]...")
	}
	pos, err := parse(fs, args[:dash], 1)
	if err != nil {
		return err
	}
	var info ExecInfo
	if err := newClient(*socket).do("GET", "/v1/agents/"+url.PathEscape(pos[0])+"/exec", nil, &info); err != nil {
		return err
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return fmt.Errorf("exec needs the ip command (iproute2): %w", err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TERM=" + os.Getenv("TERM")}
	env = append(env, info.Env...)
	argv := append([]string{"ip", "netns", "exec", info.NetNS}, args[dash+1:]...)
	return syscall.Exec(ip, argv, env)
}

// readLog prints records as a table (or JSON lines), following if asked.
func readLog(fs *flag.FlagSet, socket *string, args []string) error {
	agentF := fs.String("agent", "", "agent")
	kind := fs.String("kind", "", "dns, tls, http, tcp or connect")
	denied := fs.Bool("denied", false, "denied only")
	since := fs.String("since", "", "a duration (10m) or an RFC 3339 time")
	limit := fs.Int("limit", 50, "newest records to show (0: all kept)")
	follow := fs.Bool("follow", false, "keep printing new records")
	asJSON := fs.Bool("json", false, "JSON lines")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	q := url.Values{}
	for k, v := range map[string]string{"agent": *agentF, "kind": *kind, "since": *since} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *denied {
		q.Set("denied", "1")
	}
	if *follow {
		q.Set("follow", "1")
	}
	q.Set("limit", fmt.Sprint(*limit))
	resp, err := newClient(*socket).http.Get("http://agenthold/v1/log?" + q.Encode())
	if err != nil {
		return unreachableError{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s", strings.TrimSpace(string(b)))
	}
	if *asJSON {
		_, err := io.Copy(os.Stdout, resp.Body)
		return err
	}
	return printLogTable(os.Stdout, resp.Body, *follow)
}

// printLogTable renders JSON-line records as a table.
func printLogTable(w io.Writer, r io.Reader, follow bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tAGENT\tKIND\tDESTINATION\tVERDICT\tDETAIL\tSECRET\tBYTES ↑/↓")
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rec, err := egresslog.ParseJSON(sc.Bytes())
		if err != nil {
			continue
		}
		fmt.Fprintln(tw, logRow(rec))
		if follow {
			tw.Flush()
		}
	}
	return tw.Flush()
}

func logRow(r egresslog.Record) string {
	dest := r.Host
	if r.Port != 0 {
		dest = net.JoinHostPort(r.Host, fmt.Sprint(r.Port))
	}
	verdict := "allowed"
	switch {
	case r.Report:
		verdict = "report"
	case !r.Allowed:
		verdict = "DENIED"
	}
	detail := r.Reason
	switch r.Kind {
	case egresslog.KindHTTP:
		detail = fmt.Sprintf("%s %s %d", r.Method, r.Path, r.Status)
		if !r.Allowed || r.Status >= 400 {
			detail += " " + r.Reason
		}
	case egresslog.KindDNS:
		detail = fmt.Sprintf("%s, %d answers", r.Method, r.Answers)
		if !r.Allowed {
			detail += ", " + r.Reason
		}
	}
	bytes := ""
	if r.BytesUp != 0 || r.Bytes != 0 {
		bytes = fmt.Sprintf("%d/%d", r.BytesUp, r.Bytes)
	}
	return strings.Join([]string{r.Time.Local().Format("15:04:05.000"), r.Agent, string(r.Kind), dest, verdict, detail, r.Secret, bytes}, "\t")
}
