//go:build linux

package main

import (
	"fmt"
	"strings"
)

// sessionStep is one thing a sandbox tries, and what should come of it.
type sessionStep struct {
	title  string
	agent  string
	script string
	// check judges the output (and whether the command failed) and says
	// what happened in one line.
	check func(out string, failed bool) (bool, string)
}

func contains(want string) func(string, bool) (bool, string) {
	return func(out string, failed bool) (bool, string) {
		return !failed && strings.Contains(out, want), firstLine(out)
	}
}

func fails(why string) func(string, bool) (bool, string) {
	return func(out string, failed bool) (bool, string) {
		return failed, why + ": " + firstLine(out)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if len(s) > 110 {
		s = s[:110] + "…"
	}
	return s
}

var sessionSteps = []sessionStep{
	{
		title: "alice's environment holds a placeholder, not the key", agent: "alice",
		script: `echo "$ANTHROPIC_API_KEY"`,
		check: func(out string, failed bool) (bool, string) {
			return !failed && strings.HasPrefix(out, "agenthold-placeholder-") && !strings.Contains(out, demoAnthropicKey), firstLine(out)
		},
	},
	{
		title: "alice calls the LLM API with the placeholder: the gateway injects the key, the answer streams", agent: "alice",
		script: `curl -sS -N https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -H 'content-type: application/json' -d '{"model":"demo","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'`,
		check: func(out string, failed bool) (bool, string) {
			ok := !failed && strings.Contains(out, "the fake API") && strings.Contains(out, "message_stop")
			return ok, fmt.Sprintf("%d server-sent events, text: %q", strings.Count(out, "event:"), "Hello from the fake API")
		},
	},
	{
		title: "the same call without the proxy hint, through the transparent proxy", agent: "alice",
		script: `curl -sS -N --noproxy '*' https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d '{}'`,
		check:  contains("message_stop"),
	},
	{
		title: "alice clones a private repository: the gateway adds her GitHub token", agent: "alice",
		script: `rm -rf hello && git clone -q https://github.com/demo/hello.git hello && cat hello/README.md`,
		check:  contains("cloned through agenthold"),
	},
	{
		title: "alice reaches *.npmjs.org (TLS passed through untouched)", agent: "alice",
		script: `curl -sS https://registry.npmjs.org/left-pad`,
		check:  contains(`"served-by":"registry.npmjs.org"`),
	},
	{
		title: "but not npmjs.org itself: a wildcard covers subdomains only", agent: "alice",
		script: `curl -sS https://npmjs.org/`,
		check:  fails("refused"),
	},
	{
		title: "a name her policy does not allow does not even resolve (DNS cannot leak it)", agent: "alice",
		script: `getent hosts evil.example.org || echo "evil.example.org: no address (NXDOMAIN)"; getent hosts github.com`,
		check: func(out string, failed bool) (bool, string) {
			return strings.Contains(out, "NXDOMAIN") && strings.Contains(out, "198.18.10.2"), firstLine(out)
		},
	},
	{
		title: "SSH to an allowed name and port: the server speaks first, by the name alice resolved", agent: "alice",
		script: `bash -c 'exec 3<>/dev/tcp/ssh.example.net/22; head -1 <&3'`,
		check:  contains("SSH-2.0"),
	},
	{
		title: "a placeholder sent to a host its rule does not name goes out as a placeholder", agent: "alice",
		script: `curl -sS https://echo.example.com/ -H "Authorization: Bearer $ANTHROPIC_API_KEY"`,
		check: func(out string, failed bool) (bool, string) {
			return !failed && strings.Contains(out, "agenthold-placeholder-") && !strings.Contains(out, demoAnthropicKey), firstLine(out)
		},
	},
	{
		title: "bob may use plain HTTP to www.example.com", agent: "bob",
		script: `curl -sS http://www.example.com/`,
		check:  contains("Example Domain"),
	},
	{
		title: "bob may not reach the LLM API, and has no key for it", agent: "bob",
		script: `echo "key: [$ANTHROPIC_API_KEY]"; curl -sS https://api.anthropic.com/v1/messages`,
		check: func(out string, failed bool) (bool, string) {
			return failed && strings.Contains(out, "key: []"), firstLine(strings.TrimPrefix(out, "key: []\n"))
		},
	},
}

// runSession runs the steps and prints what happened; it returns how many
// did not go as expected.
func runSession(w *world) int {
	failed := 0
	for i, s := range sessionSteps {
		out, err := w.inSandbox(s.agent, s.script)
		ok, what := s.check(out, err != nil)
		mark := "✓"
		if !ok {
			mark = "✗"
			failed++
		}
		fmt.Printf("\n%2d. [%s] %s\n    %s $ %s\n    %s %s\n", i+1, s.agent, s.title, s.agent, s.script, mark, what)
	}
	return failed
}
