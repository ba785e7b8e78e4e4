// Command agenthold is the egress gateway of a sandbox server, as the
// seed "Egress and secrets" describes it, composed from this module's
// packages: each agent's sandbox gets a network namespace whose only way
// out is the gateway, which resolves names by the agent's policy, proxies
// TCP by name, injects secrets the sandbox only holds placeholders for,
// and logs every DNS query, connection and request.
//
//	agenthold serve --config agenthold.yaml   run the gateway (root)
//	agenthold demo                            a self-contained world, then a scripted session
//	agenthold agent create NAME --mode allowlist --allow github.com
//	agenthold secret put github --preset github < token
//	agenthold secret attach NAME github --env GITHUB_TOKEN
//	agenthold exec NAME -- curl https://api.github.com/user
//	agenthold log --agent NAME --follow
//
// Run `agenthold help` for every command.
package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit codes that scripts can rely on.
const (
	exitOK          = 0
	exitFailed      = 1 // the server refused or the command failed
	exitUsage       = 2 // wrong command line
	exitUnreachable = 3 // no server on the admin socket
)

// usageError is a command line mistake: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// unreachableError means the admin socket did not answer: exit code 3.
type unreachableError struct{ err error }

func (e unreachableError) Error() string {
	return fmt.Sprintf("%v\nIs agenthold serve running? Point --socket (or AGENTHOLD_SOCKET) at its admin socket.", e.err)
}

const usageText = `agenthold: the egress gateway of a sandbox server.

Usage:
  agenthold serve [--config FILE]                 run the gateway (root; see agenthold.example.yaml)
  agenthold demo [--keep | --down]                build a world in namespaces and show the gateway at work
  agenthold agent create NAME [--mode open|allowlist] [--allow ENTRY]... [--allow-private] [--netns PATH]
  agenthold agent list [--json]
  agenthold agent delete NAME
  agenthold policy show AGENT
  agenthold policy set AGENT [--mode open|allowlist] [--allow ENTRY]... [--allow-private]
  agenthold secret put NAME (--preset NAME | --host HOST... --header NAME [--template T] [--path P]... [--login])
                           [--from-file FILE] [--owner OWNER]     the value is read from stdin unless --from-file
  agenthold secret list [--json]
  agenthold secret delete NAME
  agenthold secret attach AGENT SECRET --env VAR
  agenthold secret detach AGENT SECRET
  agenthold exec AGENT -- COMMAND [ARG]...        run a command in the agent's sandbox, with its environment
  agenthold log [--agent A] [--kind K] [--denied] [--since DURATION] [--limit N] [--follow] [--json]
  agenthold metrics                               the Prometheus counters

Every command but serve and demo talks to the server's admin socket:
--socket PATH, or AGENTHOLD_SOCKET, or /var/lib/agenthold/admin.sock.
Policy entries: github.com (ports 80, 443), *.npmjs.org (subdomains), github.com:22,
registry.example.com:*, 203.0.113.0/24:443, *. Presets: anthropic, openai, github,
github-git, gitlab, gitlab-git, openrouter.

Exit codes: 0 done, 1 failed (the message says why), 2 bad usage, 3 no server.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	err := dispatch(args)
	var ue usageError
	var unreachable unreachableError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "agenthold: %v\nRun 'agenthold help' for usage.\n", err)
		return exitUsage
	case errors.As(err, &unreachable):
		fmt.Fprintf(os.Stderr, "agenthold: %v\n", err)
		return exitUnreachable
	}
	fmt.Fprintf(os.Stderr, "agenthold: %v\n", err)
	return exitFailed
}

func dispatch(args []string) error {
	if len(args) == 0 {
		return usagef("no command")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		fmt.Print(usageText)
		return nil
	case "serve":
		return cmdServe(rest)
	case "demo":
		return cmdDemo(rest)
	case "agent", "policy", "secret":
		if len(rest) == 0 {
			return usagef("%s needs a subcommand", cmd)
		}
		return cmdAdmin(cmd+" "+rest[0], rest[1:])
	case "exec", "log", "metrics":
		return cmdAdmin(cmd, rest)
	}
	return usagef("unknown command %q", cmd)
}
