//go:build linux

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
// Run `agenthold help` for every command, and `agenthold CMD --help` for
// one.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/agenthold/egress/vault"
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

// errHelpShown ends a command whose --help was printed: exit code 0.
var errHelpShown = errors.New("help shown")

// command is one command of the command line.
type command struct {
	name     string // one or two words
	synopsis string // the arguments, after the name
	help     string // what it does, with an example where syntax needs one
	run      func(env *cliEnv, fs *flag.FlagSet, args []string) error
}

// cliEnv is what every command may use: the global flags.
type cliEnv struct {
	socket string
}

const usageHead = `agenthold: the egress gateway of a sandbox server.

Usage: agenthold [--socket PATH] COMMAND [ARGS]   (agenthold COMMAND --help for one command)
       agenthold version

`

const usageTail = `
Every command but serve and demo talks to the server's admin socket:
--socket PATH (anywhere on the line), or AGENTHOLD_SOCKET, or
/var/lib/agenthold/admin.sock.

Policy entries: github.com (ports 80, 443), *.npmjs.org (subdomains), github.com:22,
registry.example.com:*, 203.0.113.0/24:443, *; a deny entry starts with !
(!pastebin.com), and wins over every other. Presets: PRESETS.

Exit codes: 0 done, 1 failed (the message says why), 2 bad usage, 3 no server;
exec exits with its command's status.
`

// usageText lists every command.
func usageText() string {
	var b strings.Builder
	b.WriteString(usageHead)
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-48s %s\n", c.name+" "+c.synopsis, firstSentence(c.help))
	}
	b.WriteString(strings.Replace(usageTail, "PRESETS", strings.Join(vault.PresetNames(), ", "), 1))
	return b.String()
}

// firstSentence is s up to its first full stop (a dot before a space or
// the end; not one inside a name such as egress.log_keep) or line break.
func firstSentence(s string) string {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\n':
			return s[:i]
		case s[i] == '.' && (i+1 == len(s) || s[i+1] == ' ' || s[i+1] == '\n'):
			return s[:i]
		}
	}
	return s
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	err := dispatch(args)
	var ue usageError
	var unreachable unreachableError
	var code exitCode
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return exitOK
	case errors.As(err, &code):
		return int(code)
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
	if len(args) > 0 && args[0] == sandboxInitCommand {
		return sandboxInit()
	}
	env, args, err := globalFlags(args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return usagef("no command")
	}
	switch args[0] {
	case "help", "-h", "--help":
		if len(args) == 1 {
			fmt.Print(usageText())
			return nil
		}
		// help COMMAND is COMMAND --help.
		c, _, err := findCommand(args[1:])
		if err != nil {
			return err
		}
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return c.run(env, fs, []string{"--help"})
	case "version":
		return cmdVersion(args[1:])
	}
	c, rest, err := findCommand(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return c.run(env, fs, rest)
}

// globalFlags takes --socket out of args wherever it stands before a
// "--" (after which the words belong to exec's command).
func globalFlags(args []string) (*cliEnv, []string, error) {
	env := &cliEnv{}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		switch {
		case a == "--socket" || a == "-socket":
			if i+1 == len(args) {
				return nil, nil, usagef("--socket needs a path")
			}
			env.socket = args[i+1]
			i++
		case strings.HasPrefix(a, "--socket="), strings.HasPrefix(a, "-socket="):
			env.socket = a[strings.IndexByte(a, '=')+1:]
		default:
			rest = append(rest, a)
		}
	}
	return env, rest, nil
}

// findCommand matches the longest command name at the start of args.
func findCommand(args []string) (*command, []string, error) {
	for _, words := range []int{2, 1} {
		if len(args) < words {
			continue
		}
		name := strings.Join(args[:words], " ")
		for i := range commands {
			if commands[i].name == name {
				return &commands[i], args[words:], nil
			}
		}
	}
	for i := range commands {
		if strings.HasPrefix(commands[i].name, args[0]+" ") {
			return nil, nil, usagef("%s needs a subcommand (%s)", args[0], subcommands(args[0]))
		}
	}
	return nil, nil, usagef("unknown command %q", args[0])
}

func subcommands(group string) string {
	var subs []string
	for _, c := range commands {
		if sub, ok := strings.CutPrefix(c.name, group+" "); ok {
			subs = append(subs, sub)
		}
	}
	return strings.Join(subs, ", ")
}

// parse parses a command's flags, which may come before, between and after
// its positional arguments, and checks their number. --help prints the
// command's own usage.
func parse(fs *flag.FlagSet, args []string, positional int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printCommandHelp(os.Stdout, fs)
				return nil, errHelpShown
			}
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if positional >= 0 && len(pos) != positional { // below 0: any number
		return nil, usagef("%s takes %d argument(s), not %d (agenthold %s --help)", fs.Name(), positional, len(pos), fs.Name())
	}
	return pos, nil
}

// printCommandHelp prints one command's synopsis, description and flags.
func printCommandHelp(w io.Writer, fs *flag.FlagSet) {
	for _, c := range commands {
		if c.name == fs.Name() {
			fmt.Fprintf(w, "Usage: agenthold %s %s\n\n%s\n", c.name, c.synopsis, c.help)
		}
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	if fs.Name() != "serve" && fs.Name() != "demo" {
		fmt.Fprintln(w, "  -socket string\n    \tthe admin socket (global: anywhere on the line; default $AGENTHOLD_SOCKET or /var/lib/agenthold/admin.sock)")
	}
}
