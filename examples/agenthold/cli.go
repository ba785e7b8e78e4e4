//go:build linux

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
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"
	"go.yaml.in/yaml/v3"

	"github.com/agenthold/egress/egresslog"
	"github.com/agenthold/egress/policy"
	"github.com/agenthold/egress/policy/learn"
	"github.com/agenthold/egress/vault"
)

// commands is the command line, in the order help lists it. It is set in
// init: the commands' help refers back to it.
var commands []command

func init() {
	commands = []command{
		{name: "serve", synopsis: "[--config FILE]", run: cmdServe,
			help: "Run the gateway (root). See agenthold.example.yaml for the configuration."},
		{name: "demo", synopsis: "[--keep | --down]", run: cmdDemo,
			help: "Build a world in namespaces and show the gateway at work.\n--keep leaves it running (make dev) until --down."},
		{name: "agent create", synopsis: "NAME [--mode open|allowlist] [--allow ENTRY]... [--allow-private] [--report] [QUOTA FLAGS] [--netns PATH] [--uid N --gid N] [--remote]", run: cmdAgentCreate,
			help: "Create an agent: a network namespace wired to the gateway, and a policy.\n" +
				"--netns adopts an existing namespace (a container's) instead of creating one.\n" +
				"--remote makes an agent for a sandbox on another machine: no namespace here, and a token it\n" +
				"presents to the explicit proxy on egress.remote_listen (shown once).\n" +
				"exec runs its commands as --uid/--gid, by default sandbox.uid_base plus its network index.\n" +
				"Example: agenthold agent create alice --mode allowlist --allow github.com --allow '*.npmjs.org'"},
		{name: "agent list", synopsis: "[--json]", run: cmdAgentList,
			help: "List the agents, their policies, addresses and secrets."},
		{name: "agent delete", synopsis: "NAME", run: cmdAgentDelete,
			help: "Delete an agent: its network, its home and its attachments."},
		{name: "policy show", synopsis: "AGENT", run: cmdPolicyShow,
			help: "Print an agent's policy."},
		{name: "policy set", synopsis: "AGENT [--mode open|allowlist] [--allow ENTRY]... [--allow-private] [--report] [QUOTA FLAGS]", run: cmdPolicySet,
			help: "Replace an agent's policy; the next connection, DNS query and request use it.\n" +
				"Example: agenthold policy set bob --mode allowlist --allow www.example.com --allow github.com:22\n" +
				"Request entries allow some requests only, by method and path (* one segment, ** any), and deny others:\n" +
				"  --allow 'GET,HEAD api.github.com/repos/acme/*' --allow 'github.com/acme/scratch.git/**' --allow '!DELETE *.github.com/**'\n" +
				"MCP entries allow an MCP endpoint and the tools an agent may call on it:\n" +
				"  --allow 'mcp https://mcp.example.com/mcp tools=search,fetch'"},
		{name: "policy suggest", synopsis: "AGENT [--since DURATION] [--collapse N] [--requests [--collapse-ids]] [--apply]", run: cmdPolicySuggest,
			help: "Propose the smallest allowlist that covers what the agent did.\n" +
				"Run the agent in report mode first (policy set AGENT --mode allowlist --report). It prints the policy file and the policy set command,\n" +
				"with how often and when each entry was used, and what was only attempted; --apply sets it.\n" +
				"--collapse N turns N or more sibling names into one *.parent entry (never *).\n" +
				"--requests proposes request entries (method and path) for the hosts whose requests were seen;\n" +
				"--collapse-ids then writes ID-like path segments (numbers, UUIDs, long tokens) as *."},
		{name: "secret put", synopsis: "NAME (--preset NAME | --host HOST... [--header NAME] [--template T] [--path P]... [--mode M] [--replace-in P]... [--body-type T]...) [--from-file FILE | --source-file FILE | --source-command CMD] [--owner OWNER]", run: cmdSecretPut,
			help: "Store a secret and its injection rule; the value is read from stdin (or --from-file), never from an argument,\n" +
				"or the gateway reads it itself: --source-file (again whenever the file changes) or --source-command (its output,\n" +
				"again every --refresh); a failing source keeps its last value for --max-stale, then the secret is refused.\n" +
				"--template is a Go template of the header's value: {{.Value}} is the secret, and base64 is available.\n" +
				"Examples:\n" +
				"  agenthold secret put github --preset github < token\n" +
				"  agenthold secret put internal --host api.internal.example --header Authorization --template 'Bearer {{.Value}}' < token\n" +
				"  agenthold secret put git --host github.com --header Authorization --template 'Basic {{base64 (print \"x-access-token:\" .Value)}}' < token\n" +
				"  agenthold secret put aws --preset aws <<< 'AKIA...:secret'     # the sandbox signs with the placeholder; the gateway re-signs\n" +
				"  agenthold secret put app --preset github-app --from-file app.json  # installation tokens minted at the gateway\n" +
				"  agenthold secret put bot --host api.telegram.org --replace-in path < token  # /bot<placeholder>/sendMessage\n" +
				"  agenthold secret put gh --preset github --source-command 'gh auth token' --refresh 30m\n" +
				"  agenthold secret put ci --preset github --source-file /var/run/secrets/ci/token      # a mounted Secret, followed"},
		{name: "secret list", synopsis: "[--json]", run: cmdSecretList,
			help: "List the secrets and their rules (never their values)."},
		{name: "secret delete", synopsis: "NAME", run: cmdSecretDelete,
			help: "Delete a secret and every attachment of it."},
		{name: "secret attach", synopsis: "AGENT SECRET --env VAR", run: cmdSecretAttach,
			help: "Give an agent a secret: its sandbox's VAR holds a placeholder the gateway replaces on the way out."},
		{name: "secret detach", synopsis: "AGENT SECRET", run: cmdSecretDetach,
			help: "Take a secret from an agent."},
		{name: "secret rotate-key", synopsis: "", run: cmdSecretRotateKey,
			help: "Re-seal every secret under a new master key, written over the key file (secrets.master_key_file);\n" +
				"the old key opens nothing afterwards. A crash at any point leaves a vault that opens at the next start.\n" +
				"Back the new key up: a backup made before opens only with the key it was made under."},
		{name: "backup", synopsis: "FILE [--passphrase-file F]", run: cmdBackup,
			help: "Write the gateway's state (agents, secrets, CA, audit key, console token) to FILE, sealed under the master key,\n" +
				"or under the passphrase in F (the backup then carries the master key, and restores on any machine)."},
		{name: "restore", synopsis: "FILE [--config C] [--passphrase-file F]", run: cmdRestore,
			help: "Restore a backup into the data directory of the configuration, which must hold no state yet and no running\n" +
				"server: then `agenthold serve` serves the same agents and secrets. A backup made without a passphrase\n" +
				"opens with the master key it was made under, which must be at secrets.master_key_file (or in AGENTHOLD_MASTER_KEY)."},
		{name: "exec", synopsis: "AGENT -- COMMAND [ARG]...", run: cmdExec,
			help: "Run a command in the agent's sandbox (root): its network namespace, and new mount, PID, UTS and IPC\n" +
				"namespaces, as the agent's uid and gid with no capability and no_new_privs. The gateway's files, the admin\n" +
				"socket, other agents' namespaces and every host process are out of its sight; its home is /home/AGENT.\n" +
				"It is not a container: the host's filesystem is readable as file permissions allow. Production sandboxes\n" +
				"are containers that join the agent's namespace (agent create --netns)."},
		{name: "audit key", synopsis: "", run: cmdAuditKey,
			help: "Print the public half of the key that seals the request log file (egress.log_file_audit), for verifying it anywhere."},
		{name: "audit verify", synopsis: "[--key BASE64] FILE...", run: cmdAuditVerify,
			help: "Check a sealed request log, its files oldest first: each place where a line was changed, removed, reordered or added,\n" +
				"and the last lines no seal covers yet (a crash leaves some; they are not tampering)."},
		{name: "ui token", synopsis: "", run: cmdUIToken,
			help: "Make the web console's login token (ui_listen), shown this once; a new one ends every console session."},
		{name: "approvals", synopsis: "[--follow]", run: cmdApprovals,
			help: "List what agents in ask mode wait on: a destination no entry allows, held until answered or timed out\n" +
				"(egress.approvals.timeout). --follow keeps printing new requests as they are raised."},
		{name: "approve", synopsis: "ID [--once|--session|--always] [--by NAME]", run: cmdApprove,
			help: "Approve a pending request: --once (the default: what waits, and the connection after an approved lookup),\n" +
				"--session (until the agent is deleted or the gateway restarts), --always (an allow entry in the agent's policy)."},
		{name: "deny", synopsis: "ID [--entry] [--by NAME]", run: cmdDeny,
			help: "Refuse a pending request; --entry also adds a deny entry to the agent's policy."},
		{name: "log", synopsis: "[--agent A] [--kind K] [--denied] [--since DURATION] [--limit N] [--follow] [--json]", run: cmdLog,
			help: "Print the request log (per agent, the newest egress.log_keep allowed records and as many denied ones, kept in memory)."},
		{name: "metrics", synopsis: "", run: cmdMetrics,
			help: "Print the Prometheus counters."},
		{name: "ca", synopsis: "[--bundle]", run: cmdCA,
			help: "Print the gateway's CA certificate (PEM), which a remote agent's machine trusts for intercepted hosts;\n" +
				"--bundle prints the whole bundle sandboxes trust (the system's roots, egress.upstream_roots and the CA).\n" +
				"Both are also in DATA_DIR/trust/ (ca.crt, bundle.pem, node-extra.pem), readable by every uid, for a\n" +
				"container runtime to mount into a sandbox it starts in an agent's namespace."},
	}
}

func cmdServe(_ *cliEnv, fs *flag.FlagSet, args []string) error {
	config := fs.String("config", "", "configuration file (default: the built-in defaults)")
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
	notifySystemd(logger, "READY=1")
	fmt.Println("agenthold: ready") // for scripts that wait
	<-s.servers.Context().Done()    // SIGTERM, or a server failed
	notifySystemd(logger, "STOPPING=1")
	logger.Info("agenthold stopping: draining, then removing namespaces, links and rules")
	if err := s.servers.StopAndWait(drainTimeout); err != nil {
		return fmt.Errorf("gateway stopped: %w", err)
	}
	return nil
}

// client talks to the admin socket.
type client struct {
	http *http.Client
}

func (env *cliEnv) client() *client {
	socket := env.socket
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

// get fetches a path and returns the response for streaming.
func (c *client) get(path string) (*http.Response, error) {
	resp, err := c.http.Get("http://agenthold" + path)
	if err != nil {
		return nil, unreachableError{err}
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return nil, fmt.Errorf("%s", e.Error)
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

func agentPath(name string, rest ...string) string {
	p := "/v1/agents/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// policyFlags are the flags that write a policy.
func policyFlags(fs *flag.FlagSet, defaultMode string) func() PolicySpec {
	mode := fs.String("mode", defaultMode, "open (any public address), allowlist (only --allow entries), or ask (an allowlist that holds other names until a person answers: agenthold approvals)")
	var allow stringList
	fs.Var(&allow, "allow", `an allow entry (repeatable): github.com, *.npmjs.org, github.com:22, 203.0.113.0/24:443, *, 'GET api.github.com/repos/**', '!DELETE github.com/**', 'mcp https://host/mcp tools=a,b'`)
	private := fs.Bool("allow-private", false, "allow private networks (RFC 1918, ULA, CGNAT)")
	report := fs.Bool("report", false, "report mode: allow what the policy would deny, and record it (then: policy suggest)")
	var q QuotaSpec
	for _, f := range quotaFields(&q) {
		fs.Float64Var(f.v, f.flag, 0, f.usage)
	}
	return func() PolicySpec {
		return PolicySpec{Mode: *mode, Allow: allow, AllowPrivateNetworks: *private, Report: *report, Quotas: q}
	}
}

func cmdAgentCreate(env *cliEnv, fs *flag.FlagSet, args []string) error {
	pol := policyFlags(fs, "open")
	ns := fs.String("netns", "", "adopt this network namespace (under /run/netns) instead of creating one")
	remote := fs.Bool("remote", false, "a sandbox on another machine: no namespace here; it gets a token for egress.remote_listen")
	uid := fs.Uint("uid", 0, "the uid exec runs the agent's commands as (default: sandbox.uid_base + index)")
	gid := fs.Uint("gid", 0, "the gid exec runs the agent's commands as (default: sandbox.uid_base + index)")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	if *uid > 1<<31 || *gid > 1<<31 {
		return usagef("agent create: --uid and --gid must be below 2^31")
	}
	var info AgentInfo
	spec := AgentSpec{Name: pos[0], NetNS: *ns, Policy: pol(), UID: uint32(*uid), GID: uint32(*gid), Remote: *remote}
	if err := env.client().do("POST", "/v1/agents", spec, &info); err != nil {
		return err
	}
	if info.Remote {
		fmt.Printf("agent %s created, remote: policy %s\n", info.Name, policyText(info.Policy))
		fmt.Printf("  its token, shown this once (agenthold keeps only its hash): %s\n", info.Token)
		if info.Proxy != "" {
			scheme, addr, _ := strings.Cut(info.Proxy, "://")
			fmt.Printf("  on its machine: HTTPS_PROXY=%s://%s:%s@%s, trusting the gateway's CA (agenthold ca)\n", scheme, info.Name, info.Token, addr)
		} else {
			fmt.Println("  egress.remote_listen is not set: remote agents cannot connect until it is")
		}
		return nil
	}
	fmt.Printf("agent %s created: sandbox %s (%s), namespace %s, uid %d gid %d, policy %s\n",
		info.Name, info.Sandbox4, info.Sandbox6, info.NetNS, info.UID, info.GID, policyText(info.Policy))
	return nil
}

func cmdAgentList(env *cliEnv, fs *flag.FlagSet, args []string) error {
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	var list []AgentInfo
	if err := env.client().do("GET", "/v1/agents", nil, &list); err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(list)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPOLICY\tSANDBOX\tNAMESPACE\tUID\tSECRETS")
	for _, a := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", a.Name, policyText(a.Policy), a.Sandbox4, a.NetNS, a.UID, strings.Join(a.Secrets, ", "))
	}
	return tw.Flush()
}

func cmdAgentDelete(env *cliEnv, fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	if err := env.client().do("DELETE", agentPath(pos[0]), nil, nil); err != nil {
		return err
	}
	fmt.Printf("agent %s deleted: its network, home and attachments are gone\n", pos[0])
	return nil
}

func cmdPolicyShow(env *cliEnv, fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	var p PolicySpec
	if err := env.client().do("GET", agentPath(pos[0], "policy"), nil, &p); err != nil {
		return err
	}
	fmt.Println(policyText(p))
	return nil
}

func cmdPolicySet(env *cliEnv, fs *flag.FlagSet, args []string) error {
	pol := policyFlags(fs, "allowlist")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	if err := env.client().do("PUT", agentPath(pos[0], "policy"), pol(), nil); err != nil {
		return err
	}
	fmt.Printf("agent %s: policy now %s\n", pos[0], policyText(pol()))
	return nil
}

func cmdPolicySuggest(env *cliEnv, fs *flag.FlagSet, args []string) error {
	since := fs.String("since", "", "learn from records since: a duration (1h) or an RFC 3339 time (default: all kept)")
	collapseN := fs.Int("collapse", 0, "collapse N or more sibling names into *.parent (0: never)")
	requests := fs.Bool("requests", false, "propose request entries (method and path) for hosts whose requests were seen")
	collapseIDs := fs.Bool("collapse-ids", false, "with --requests: write ID-like path segments as *")
	apply := fs.Bool("apply", false, "set the suggested policy (keeping private networks and quotas)")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	agent := pos[0]
	var current PolicySpec
	if err := env.client().do("GET", agentPath(agent, "policy"), nil, &current); err != nil {
		return err
	}
	q := url.Values{"agent": {agent}, "limit": {"0"}}
	if *since != "" {
		q.Set("since", *since)
	}
	resp, err := env.client().get("/v1/log?" + q.Encode())
	if err != nil {
		return err
	}
	obs, skipped, err := learn.Read(resp.Body, agent)
	resp.Body.Close()
	if err != nil {
		return err
	}
	s := policy.Suggest(obs, policy.SuggestConfig{Collapse: *collapseN, Requests: *requests, CollapseIDs: *collapseIDs})
	learn.WriteSupport(os.Stdout, s, agent, len(obs), skipped)
	next := suggestedSpec(current, s)
	doc, err := yaml.Marshal(struct {
		Enforce bool     `yaml:"enforce"`
		Mode    string   `yaml:"mode"`
		Allow   []string `yaml:"allow"`
	}{true, next.Mode, next.Allow})
	if err != nil {
		return err
	}
	os.Stdout.Write(doc)
	fmt.Println("# " + policySetCommand(agent, next))
	if !*apply {
		return nil
	}
	if err := env.client().do("PUT", agentPath(agent, "policy"), next, nil); err != nil {
		return err
	}
	fmt.Printf("agent %s: policy now %s\n", agent, policyText(next))
	return nil
}

// shellQuote is s in single quotes, each of its own closed, escaped and
// reopened: one word to a POSIX shell, whatever s holds.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellWord is s as it is if a POSIX shell takes it as one word with no
// expansion, else shellQuote(s).
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == "" {
		return s
	}
	return shellQuote(s)
}

// suggestedSpec is the policy a suggestion makes of current: an allowlist
// of the suggestion's entries, keeping current's deny entries,
// private-network setting and quotas.
func suggestedSpec(current PolicySpec, s policy.Suggestion) PolicySpec {
	next := PolicySpec{Mode: "allowlist", Allow: slices.Clone(s.Document.Allow), AllowPrivateNetworks: current.AllowPrivateNetworks, Quotas: current.Quotas}
	for _, e := range current.Allow {
		if strings.HasPrefix(e, "!") {
			next.Allow = append(next.Allow, e) // deny entries stay
		}
	}
	return next
}

// policySetCommand is the `policy set` command line that sets p, each
// word a POSIX shell takes as it stands: an entry may come from what an
// agent asked for (a denied name in the console's traffic), and a person
// pastes the line into a shell.
func policySetCommand(agent string, p PolicySpec) string {
	cmd := "agenthold policy set " + shellWord(agent) + " --mode " + shellWord(p.Mode)
	for _, e := range p.Allow {
		cmd += " --allow " + shellQuote(e)
	}
	if p.AllowPrivateNetworks {
		cmd += " --allow-private"
	}
	for _, f := range quotaFields(&p.Quotas) {
		if *f.v != 0 {
			cmd += fmt.Sprintf(" --%s %g", f.flag, *f.v)
		}
	}
	return cmd
}

// quotaField is one of an agent's quotas: its flag, its short name in
// policy summaries, and where its value is.
type quotaField struct {
	flag, short, usage string
	v                  *float64
}

// quotaFields lists q's quotas, in the order the command line shows them.
func quotaFields(q *QuotaSpec) []quotaField {
	return []quotaField{
		{"connections-per-second", "connections/s", fmt.Sprintf("new connections a second, bursts of twice as many (0: %d, -1: no limit)", policy.DefaultConnectionsPerSecond), &q.ConnectionsPerSecond},
		{"dns-queries-per-second", "dns/s", fmt.Sprintf("DNS queries a second, bursts of twice as many (0: %d, -1: no limit)", policy.DefaultDNSQueriesPerSecond), &q.DNSQueriesPerSecond},
		{"bytes-per-second-up", "bytes-up/s", "bytes a second towards destinations (0: no limit)", &q.BytesPerSecondUp},
		{"bytes-per-second-down", "bytes-down/s", "bytes a second back from destinations (0: no limit)", &q.BytesPerSecondDown},
	}
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
	if p.Report {
		s += " (report mode)"
	}
	for _, f := range quotaFields(&p.Quotas) {
		if *f.v != 0 {
			s += fmt.Sprintf(" %s=%g", f.short, *f.v)
		}
	}
	return s
}

// cmdSecretPut reads the value from stdin or a file, never an argument,
// so that it stays out of shell history and process listings.
func cmdSecretPut(env *cliEnv, fs *flag.FlagSet, args []string) error {
	preset := fs.String("preset", "", "a preset rule: "+strings.Join(vault.PresetNames(), ", ")+" (aws: the value is KEY_ID:SECRET[:SESSION_TOKEN]; github-app: a JSON object of app_id, installation_id, private_key)")
	var hosts, paths stringList
	fs.Var(&hosts, "host", "a host the secret may go to (repeatable): api.example.com or *.example.com")
	fs.Var(&paths, "path", "limit the rule to this URL path prefix (repeatable)")
	header := fs.String("header", "", "the request header to set")
	tmpl := fs.String("template", "", `the header's value: {{.Value}} is the secret, e.g. "Bearer {{.Value}}" (default {{.Value}})`)
	mode := fs.String("mode", "inject", "inject (set the header, replace the placeholder where --replace-in says), login (replace it only in the header the client sends, never add it), refresh (an OAuth refresh token: only the gateway's token_refresh grant sends it), aws-sigv4 or github-app")
	var replaceIn, bodyTypes stringList
	fs.Var(&replaceIn, "replace-in", "where an inject rule replaces the placeholder (repeatable): header, query, path, body, websocket, or rule-header alone (default: header and query; path, body and websocket only when named)")
	fs.Var(&bodyTypes, "body-type", "a media type whose bodies --replace-in body replaces in (repeatable): application/json")
	fromFile := fs.String("from-file", "", "read the value from this file instead of stdin")
	owner := fs.String("owner", "", "who the secret belongs to (informational)")
	sourceFile := fs.String("source-file", "", "the gateway reads the value from this file whenever it changes (a mounted Kubernetes Secret), instead of storing one")
	sourceCommand := fs.String("source-command", "", `the gateway runs this command (words split on spaces, no shell) and uses what it prints, instead of storing a value: "gh auth token"`)
	refresh := fs.Duration("refresh", 0, "with --source-command: run it again once its value is this old (default 5m)")
	timeout := fs.Duration("timeout", 0, "with --source-command: bound on one run (default 10s)")
	maxStale := fs.Duration("max-stale", 0, "with a source: how long its last good value serves once it fails, before the secret is refused (default 15m)")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	req := SecretPut{Preset: *preset, Owner: *owner}
	if *sourceFile != "" || *sourceCommand != "" {
		src := vault.Source{File: *sourceFile, Command: strings.Fields(*sourceCommand), Refresh: *refresh, Timeout: *timeout, MaxStale: *maxStale}
		if src.File != "" && !filepath.IsAbs(src.File) {
			if src.File, err = filepath.Abs(src.File); err != nil {
				return err
			}
		}
		req.Source = &src
	}
	if *preset == "" {
		if len(hosts) == 0 {
			return usagef("secret put needs --preset, or --host (and --header, unless --replace-in names where the placeholder goes)")
		}
		r := vault.Rule{Hosts: hosts, Header: *header, Template: *tmpl, Paths: paths, Mode: vault.Mode(*mode), ReplaceIn: replaceIn, BodyTypes: bodyTypes}
		req.Rule = &r
	}
	if req.Source != nil {
		if err := env.client().do("PUT", "/v1/secrets/"+url.PathEscape(pos[0]), req, nil); err != nil {
			return err
		}
		fmt.Printf("secret %s stored: its value comes from its source, read by the gateway\n", pos[0])
		return nil
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
	if err := env.client().do("PUT", "/v1/secrets/"+url.PathEscape(pos[0]), req, nil); err != nil {
		return err
	}
	fmt.Printf("secret %s stored\n", pos[0])
	return nil
}

func cmdSecretList(env *cliEnv, fs *flag.FlagSet, args []string) error {
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	var list []vault.Info
	if err := env.client().do("GET", "/v1/secrets", nil, &list); err != nil {
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
}

func cmdSecretDelete(env *cliEnv, fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	if err := env.client().do("DELETE", "/v1/secrets/"+url.PathEscape(pos[0]), nil, nil); err != nil {
		return err
	}
	fmt.Printf("secret %s deleted, with every attachment of it\n", pos[0])
	return nil
}

func cmdSecretRotateKey(env *cliEnv, fs *flag.FlagSet, args []string) error {
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if err := env.client().do("POST", "/v1/master-key/rotate", nil, nil); err != nil {
		return err
	}
	fmt.Println("master key rotated: every secret is sealed under the new key; the old one opens nothing")
	return nil
}

func cmdBackup(env *cliEnv, fs *flag.FlagSet, args []string) error {
	passFile := fs.String("passphrase-file", "", "seal under the passphrase in this file, not the master key")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	var req struct {
		Passphrase string `json:"passphrase,omitempty"`
	}
	if *passFile != "" {
		if req.Passphrase, err = readPassphrase(*passFile); err != nil {
			return err
		}
	}
	var reply backupReply
	if err := env.client().do("POST", "/v1/backup", req, &reply); err != nil {
		return err
	}
	if err := writeFileAtomic(pos[0], reply.Backup, 0o600); err != nil {
		return err
	}
	fmt.Printf("backup written to %s (%d bytes)\n", pos[0], len(reply.Backup))
	return nil
}

func cmdRestore(_ *cliEnv, fs *flag.FlagSet, args []string) error {
	config := fs.String("config", "", "configuration file whose data directory receives the state (default: the built-in defaults)")
	passFile := fs.String("passphrase-file", "", "the file of the passphrase the backup was sealed under")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(*config)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(pos[0])
	if err != nil {
		return err
	}
	var passphrase string
	if *passFile != "" {
		if passphrase, err = readPassphrase(*passFile); err != nil {
			return err
		}
	}
	if err := restoreBackup(cfg.DataDir, cfg.masterKeyFile(), data, []byte(passphrase)); err != nil {
		return err
	}
	fmt.Printf("restored into %s: start the server there\n", cfg.DataDir)
	return nil
}

// readPassphrase reads a passphrase from a file, without its final
// newline; an empty one is refused.
func readPassphrase(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("%s holds no passphrase", path)
	}
	return p, nil
}

func cmdSecretAttach(env *cliEnv, fs *flag.FlagSet, args []string) error {
	envVar := fs.String("env", "", "the sandbox's environment variable that holds the placeholder")
	pos, err := parse(fs, args, 2)
	if err != nil {
		return err
	}
	if *envVar == "" {
		return usagef("secret attach needs --env VAR")
	}
	var out map[string]string
	if err := env.client().do("POST", agentPath(pos[0], "secrets"), AttachRequest{Secret: pos[1], Env: *envVar}, &out); err != nil {
		return err
	}
	fmt.Printf("%s: $%s now holds %s, the placeholder for %s\n", pos[0], *envVar, out["placeholder"], pos[1])
	return nil
}

func cmdSecretDetach(env *cliEnv, fs *flag.FlagSet, args []string) error {
	pos, err := parse(fs, args, 2)
	if err != nil {
		return err
	}
	if err := env.client().do("DELETE", agentPath(pos[0], "secrets", pos[1]), nil, nil); err != nil {
		return err
	}
	fmt.Printf("%s: secret %s detached\n", pos[0], pos[1])
	return nil
}

// cmdExec runs a command confined to an agent's sandbox (see sandbox.go).
func cmdExec(env *cliEnv, fs *flag.FlagSet, args []string) error {
	dash := -1
	for i, a := range args {
		if a == "--" {
			dash = i
			break
		}
	}
	if dash < 0 {
		if slices.Contains(args, "--help") || slices.Contains(args, "-h") || len(args) < 2 {
			if _, err := parse(fs, args, 1); err != nil { // --help, or a usage error
				return err
			}
		}
		// The command's own flags (curl -sI) are not exec's: without "--"
		// they read as exec's, and no flag error would say why.
		return usagef("exec needs -- before the command: agenthold exec %s -- %s", args[0], strings.Join(args[1:], " "))
	}
	if dash == len(args)-1 {
		return usagef("exec AGENT -- COMMAND [ARG]...")
	}
	pos, err := parse(fs, args[:dash], 1)
	if err != nil {
		return err
	}
	var info ExecInfo
	if err := env.client().do("GET", agentPath(pos[0], "exec"), nil, &info); err != nil {
		return err
	}
	return runSandboxed(info, args[dash+1:])
}

func cmdMetrics(env *cliEnv, fs *flag.FlagSet, args []string) error {
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	resp, err := env.client().get("/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

func cmdCA(env *cliEnv, fs *flag.FlagSet, args []string) error {
	bundle := fs.Bool("bundle", false, "print the bundle sandboxes trust, not only the CA")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	path := "/v1/ca"
	if *bundle {
		path += "?bundle=1"
	}
	resp, err := env.client().get(path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

// cmdLog prints records as a table (or JSON lines), following if asked.
func cmdLog(env *cliEnv, fs *flag.FlagSet, args []string) error {
	agentF := fs.String("agent", "", "only this agent")
	kind := fs.String("kind", "", "only this kind: dns, tls, http, tcp or connect")
	denied := fs.Bool("denied", false, "only denied records")
	since := fs.String("since", "", "only records since: a duration (10m) or an RFC 3339 time")
	limit := fs.Int("limit", 50, "the newest records to show (0: all kept)")
	follow := fs.Bool("follow", false, "keep printing new records")
	asJSON := fs.Bool("json", false, "print JSON lines")
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
	resp, err := env.client().get("/v1/log?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if *asJSON {
		_, err := io.Copy(os.Stdout, resp.Body)
		return err
	}
	return printLogTable(os.Stdout, resp.Body, *follow)
}

// printLogTable renders JSON-line records as a table. Records arrive in
// the order they were made, a connection's when it ends, after the
// requests it carried; the table (unless it follows) is in the order
// they started, so a connection comes first and its requests below it.
func printLogTable(w io.Writer, r io.Reader, follow bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tAGENT\tKIND\tDESTINATION\tVERDICT\tDETAIL\tSECRET\tBYTES ↑/↓")
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var recs []egresslog.Record
	for sc.Scan() {
		rec, err := egresslog.ParseJSON(sc.Bytes())
		if err != nil {
			continue
		}
		if !follow {
			recs = append(recs, rec)
			continue
		}
		fmt.Fprintln(tw, logRow(rec))
		tw.Flush()
	}
	slices.SortStableFunc(recs, func(a, b egresslog.Record) int { return a.Time.Compare(b.Time) })
	for _, rec := range recs {
		fmt.Fprintln(tw, logRow(rec))
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
		// A denial, or an allowed name that got no answer because the
		// upstream failed (SERVFAIL, REFUSED): say why.
		if r.Reason != "" && (!r.Allowed || (r.Status != dns.RcodeSuccess && r.Status != dns.RcodeNameError)) {
			detail += ", " + r.Reason
		}
	}
	bytes := ""
	if r.BytesUp != 0 || r.BytesDown != 0 {
		bytes = fmt.Sprintf("%d/%d", r.BytesUp, r.BytesDown)
	}
	return strings.Join([]string{r.Time.Local().Format("15:04:05.000"), r.Agent, string(r.Kind), dest, verdict, detail, r.Secret, bytes}, "\t")
}
