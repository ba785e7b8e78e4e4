#!/usr/bin/env bash
# End-to-end checks of egress and secrets against a running dev stack
# (make dev): real clients in the sandboxes, through the gateway. Exits
# non-zero if any check fails, and prints the figures it measured.
set -uo pipefail

state=${AGENTHOLD_DEV_STATE:-/run/agenthold-dev/state.json}
[ -f "$state" ] || { echo "no dev stack at $state: run 'make dev' first"; exit 2; }
field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p" "$state"; }
AH=$(field binary)
export AGENTHOLD_SOCKET=$(field socket)
# The fake internet's credentials (demo constants, not real secrets):
anthropic_key=sk-ant-demo-9b1f0c3e7a5d2468
github_token=ghp_demo_4c2e8a6f0b1d3957e7a9

pass=0; fail=0
check() { # check NAME COMMAND...: the command's success is the check
	local name=$1; shift
	if out=$("$@" 2>&1); then
		pass=$((pass + 1)); printf 'PASS  %s\n' "$name"
	else
		fail=$((fail + 1)); printf 'FAIL  %s\n      %s\n' "$name" "$(printf '%s' "$out" | head -3)"
	fi
}
in_sandbox() { "$AH" exec "$1" -- sh -c "$2"; }
expect() { # expect AGENT SCRIPT PATTERN: the output matches
	local out; out=$(in_sandbox "$1" "$2" 2>&1) || { echo "$out"; return 1; }
	grep -qE -- "$3" <<<"$out" || { echo "$out"; return 1; }
}
refuse() { # refuse AGENT SCRIPT: the command fails
	! in_sandbox "$1" "$2" >/dev/null 2>&1
}

start=$(date +%s.%N)
check "both agents exist"                     bash -c "'$AH' agent list | grep -q '^alice' && '$AH' agent list | grep -q '^bob'"
check "the sandbox holds a placeholder"       expect alice 'echo "$ANTHROPIC_API_KEY"' '^agenthold-placeholder-[0-9a-f]{32}$'
check "the sandbox runs unprivileged"         expect alice 'echo "uid=$(id -u) $(grep CapEff /proc/self/status)"' '^uid=[1-9][0-9]* CapEff:\s+0{16}$'
check "the sandbox sees no gateway file"      refuse alice "ls $(dirname "$AGENTHOLD_SOCKET")/master.key $(dirname "$AGENTHOLD_SOCKET")/secrets.json"
check "injected key, streamed answer"         expect alice 'curl -sSN https://api.anthropic.com/v1/messages -H "x-api-key: $ANTHROPIC_API_KEY" -d {}' 'message_stop'
check "same through the transparent proxy"    expect alice "curl -sSN --noproxy '*' https://api.anthropic.com/v1/messages -H \"x-api-key: \$ANTHROPIC_API_KEY\" -d {}" 'message_stop'
check "inject mode sets the key on every call" expect alice "curl -sSN --noproxy '*' https://api.anthropic.com/v1/messages -d {}" 'message_stop'
check "git clone with an injected token"      expect alice 'd=$(mktemp -d) && git clone -q https://github.com/demo/hello.git $d/h && cat $d/h/README.md; rm -rf $d' 'cloned through agenthold'
check "wildcard: a subdomain"                 expect alice 'curl -sS https://registry.npmjs.org/x' 'served-by'
check "wildcard: never the apex"              refuse alice 'curl -sS https://npmjs.org/'
check "denied name: NXDOMAIN, not forwarded"  refuse alice 'getent hosts evil.example.org'
check "denied name: refused by address too"   refuse alice "curl -sS --noproxy '*' --resolve evil.example.org:443:198.18.10.6 https://evil.example.org/"
check "server-first TCP by resolved name"     expect alice "bash -c 'exec 3<>/dev/tcp/ssh.example.net/22; head -1 <&3'" '^SSH-2.0'
check "passed through: a download spliced, the kernel path off" bash -c "'$AH' exec alice -- curl -sS -o /dev/null https://registry.npmjs.org/large-blob/-/large-blob-1.0.0.tgz && recs=\$('$AH' log --json --agent alice --limit 0 | grep '\"host\":\"registry.npmjs.org\"' | grep -v '\"open\":') && grep -q '\"relay\":\"splice\"' <<<\"\$recs\" && ! grep -q '\"relay\":\"kernel\"' <<<\"\$recs\""
check "placeholder to an unnamed host stays"  expect alice 'curl -sS https://echo.example.com/ -H "Authorization: Bearer $ANTHROPIC_API_KEY"' 'Bearer agenthold-placeholder-'
check "plain HTTP for bob"                    expect bob 'curl -sS http://www.example.com/' 'Example Domain'
check "bob has no key"                        expect bob 'echo "[$ANTHROPIC_API_KEY]"' '^\[\]$'
check "bob is refused the API"                refuse bob 'curl -sS https://api.anthropic.com/'

# A policy change takes effect for the next connection.
"$AH" policy set bob --mode allowlist --allow www.example.com --allow api.anthropic.com >/dev/null
check "policy change: now allowed (no key: 401)" expect bob 'curl -sS -o /dev/null -w "%{http_code}" https://api.anthropic.com/v1/messages -d {}' '^401$'
"$AH" policy set bob --mode allowlist --allow www.example.com >/dev/null
check "policy change: denied again"           refuse bob 'curl -sS https://api.anthropic.com/'

# The matrix: the tools agents run, unmodified, as the sandbox's user;
# each row twice, with the proxy variables (the explicit proxy, for the
# tools that read them) and without (the transparent path). A row whose
# tool is absent here is skipped with a line that says so.
goget_dir=$(mktemp -d -p /var/lib agenthold-e2e-XXXXXX) && chmod 755 "$goget_dir"
trap 'rm -rf "$goget_dir"' EXIT
go build -o "$goget_dir/goget" ./scripts/e2e/goget || echo "the Go client did not build"
go build -o "$goget_dir/mcpcall" ./scripts/e2e/mcpcall || echo "the MCP client did not build"
no_proxy_vars='unset HTTPS_PROXY HTTP_PROXY https_proxy http_proxy;'
both() { # both NAME TOOL AGENT SCRIPT PATTERN
	local name=$1 tool=$2 agent=$3 script=$4 pattern=$5
	if ! in_sandbox "$agent" "command -v $tool" >/dev/null 2>&1; then
		printf 'SKIP  %s: %s is not installed here\n' "$name" "$tool"
		return
	fi
	check "$name (explicit proxy)" expect "$agent" "$script" "$pattern"
	check "$name (transparent)"    expect "$agent" "$no_proxy_vars $script" "$pattern"
}
api='https://api.anthropic.com/v1/models'
both "matrix: curl, HTTP/1.1, injected key" curl alice "curl -sS --http1.1 $api" 'demo-model'
both "matrix: curl, HTTP/2, injected key"   curl alice "curl -sS --http2 -w 'http/%{http_version}' $api | tr -d '\\n'" 'demo-model.*http/2$'
both "matrix: git clone, injected token"    git alice 'd=$(mktemp -d) && git clone -q https://github.com/demo/hello.git $d/h && cat $d/h/README.md' 'cloned through agenthold'
both "matrix: python3 urllib, injected key" python3 alice "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"$api\").read().decode())'" 'demo-model'
if in_sandbox alice 'python3 -c "import requests"' >/dev/null 2>&1; then
	both "matrix: python3 requests, injected key" python3 alice "python3 -c 'import requests; print(requests.get(\"$api\").text)'" 'demo-model'
else
	echo "SKIP  matrix: python3 requests: the module is not installed here"
fi
both "matrix: pip install from the index"   python3 alice 'd=$(mktemp -d) && python3 -m pip install -q --disable-pip-version-check --no-cache-dir --index-url https://pypi.org/simple --target $d demo-pkg && PYTHONPATH=$d python3 -c "import demo_pkg; print(demo_pkg.GREETING)"' 'installed through agenthold'
both "matrix: node https, passed through"   node alice "node -e \"require('https').get('https://registry.npmjs.org/left-pad', r => { let b = ''; r.on('data', d => b += d); r.on('end', () => console.log(r.statusCode, b)) }).on('error', e => { console.error(e.message); process.exit(1) })\"" '^200 .*served-by'
both "matrix: node fetch, injected key"     node alice "node -e \"fetch('$api').then(r => r.text()).then(t => console.log(t)).catch(e => { console.error(e.cause || e); process.exit(1) })\"" 'demo-model'
both "matrix: npm install from the registry" npm alice 'd=$(mktemp -d) && cd $d && npm install --no-audit --no-fund --no-update-notifier left-pad >/dev/null && node -e "console.log(require(\"left-pad\")(\"x\", 4, \"-\"))"' '^---x$'
both "matrix: a Go client, passed through"  "$goget_dir/goget" alice "$goget_dir/goget https://registry.npmjs.org/left-pad" 'served-by'
both "matrix: SSH banner by name"           bash alice "bash -c 'exec 3<>/dev/tcp/ssh.example.net/22; head -1 <&3'" '^SSH-2.0'
both "matrix: getent, an allowed name"      getent alice 'getent hosts github.com' '^198\.18\.10\.2 '
both "matrix: getent, a denied name"        getent alice 'getent hosts evil.example.org || echo refused' '^refused$'
both "matrix: dig, an allowed name"         dig alice 'dig +short github.com' '^198\.18\.10\.2$'
both "matrix: dig, a denied name: NXDOMAIN" dig alice 'dig evil.example.org' 'status: NXDOMAIN'
check "matrix: the denied lookups are recorded with their reason" bash -c "'$AH' log --json --denied --agent alice --limit 0 | grep '\"kind\":\"dns\",\"host\":\"evil.example.org\"' | grep -q '\"reason\":\"no allow entry matches the host\"'"

# Request entries: alice may list the API's models and clone the demo
# repository, and nothing else on those hosts: no message, no push. Each
# request on one connection is judged by its method and path; her policy
# is put back after.
"$AH" policy set alice --mode allowlist --allow 'GET,HEAD api.anthropic.com/v1/models' \
	--allow 'GET github.com/demo/hello.git/info/refs' --allow 'POST github.com/demo/hello.git/git-upload-pack' \
	--allow 'mcp https://mcp.example.com/mcp tools=search' >/dev/null
check "request entries: curl, an allowed GET"     expect alice "curl -sS $api" 'demo-model'
check "request entries: curl, a POST refused"     expect alice "curl -sS -o /dev/null -w '%{http_code} %header{proxy-status}' https://api.anthropic.com/v1/messages -d {}" '^403 .*no request rule allows the method and path'
check "request entries: both on one connection"   expect alice "curl -sS -o /dev/null -w '%{http_code} %{num_connects} ' $api --next -o /dev/null -w '%{http_code} %{num_connects}' -X DELETE $api" '^200 1 403 0$'
check "request entries: git clone allowed"        expect alice 'd=$(mktemp -d) && git clone -q https://github.com/demo/hello.git $d/h && cat $d/h/README.md' 'cloned through agenthold'
check "request entries: git push refused by path" expect alice '{ d=$(mktemp -d) && git clone -q https://github.com/demo/hello.git $d/h && cd $d/h && git -c user.email=a@example.com -c user.name=a commit -q --allow-empty -m x && git push origin HEAD:main 2>&1; echo "push exit $?"; } | tr "\n" " "' '403.*push exit [1-9]'
if [ -x "$goget_dir/goget" ]; then
	check "request entries: a Go client over HTTP/2, allowed" expect alice "$goget_dir/goget $api 2>&1 | tr '\n' ' '" 'demo-model.*HTTP/2.0'
	check "request entries: a Go client over HTTP/2, refused" expect alice "$goget_dir/goget https://api.anthropic.com/v1/files 2>&1 | tr '\n' ' '" 'HTTP/2.0.*403 Forbidden'
fi
check "request entries: an MCP client, one tool allowed, one refused, the session goes on" \
	expect alice "$goget_dir/mcpcall https://mcp.example.com/mcp search exec search 2>&1 | tr '\n' ' '" \
	'^search: search ran e2e exec: error: .*egress denied: the MCP tool is not allowed.* search: search ran e2e $'
check "request entries: the MCP refusal recorded with the tool" bash -c "'$AH' log --json --denied --agent alice --limit 0 | grep '\"tool\":\"exec\"' | grep -q '\"reason\":\"the MCP tool is not allowed\"'"
check "request entries: refusals recorded with method, path and reason" bash -c "'$AH' log --json --denied --agent alice --limit 0 | grep '\"method\":\"POST\"' | grep '\"path\":\"/demo/hello.git/git-receive-pack\"' | grep -q '\"reason\":\"no request rule allows the method and path\"'"
check "request entries: policy suggest --requests proposes them" bash -c "'$AH' policy suggest alice --requests | grep -qE '\"GET[A-Z,]* api.anthropic.com/v1/models\"|- GET[A-Z,]* api.anthropic.com/v1/models'"
"$AH" policy set alice --mode allowlist --allow api.anthropic.com --allow github.com --allow '*.npmjs.org' --allow ssh.example.net:22 \
	--allow www.example.com --allow echo.example.com --allow pypi.org --allow files.pythonhosted.org >/dev/null

# Ask mode: bob's requests to names no entry allows wait while a person
# answers (the demo's gateway holds them 8 s at most).
"$AH" policy set bob --mode ask --allow www.example.com --allow '!evil.example.org' >/dev/null
pending_id() { # pending_id NAME: the first approval request pending for NAME, waited for
	local id
	for _ in $(seq 100); do
		id=$("$AH" approvals | awk -v n="$1" '$3 == n {print $1; exit}')
		[ -n "$id" ] && { echo "$id"; return 0; }
		sleep 0.1
	done
	return 1
}
held() { # held SCRIPT NAME ANSWER PATTERN: bob's script, run while NAME's request is answered with ANSWER, prints PATTERN
	local out; out=$(mktemp)
	in_sandbox bob "$1" >"$out" 2>&1 & local pid=$!
	local id; id=$(pending_id "$2") || { wait $pid; echo "no approval request for $2:"; cat "$out"; return 1; }
	"$AH" approve "$id" "--$3" >/dev/null || { wait $pid; return 1; }
	wait $pid
	grep -qE -- "$4" "$out" || { cat "$out"; return 1; }
}
check "ask: held on a new name, approved once while it waits" held "curl -sS -o /dev/null -w '%{http_code}' https://echo.example.com/" echo.example.com once '^200$'
check "ask: the next request is held again, and refused at the timeout" bash -c "! '$AH' exec bob -- curl -sS --max-time 20 https://echo.example.com/ 2>/dev/null && '$AH' log --json --denied --agent bob --limit 0 | grep '\"host\":\"echo.example.com\"' | grep -q '\"reason\":\"no answer to the approval request in time\"'"
check "ask: 30 at once wait on one request"      bash -c "for i in \$(seq 30); do '$AH' exec bob -- curl -sS -o /dev/null --max-time 20 https://registry.npmjs.org/x & done; id=''; for _ in \$(seq 100); do id=\$('$AH' approvals | awk '\$3 == \"registry.npmjs.org\" {print \$1}'); [ -n \"\$id\" ] && break; sleep 0.1; done; [ \$(echo \"\$id\" | wc -w) = 1 ] && '$AH' approve \$id --always >/dev/null; wait"
check "ask: always added the entry"              bash -c "'$AH' policy show bob | grep -q 'registry.npmjs.org'"
check "ask: and it passes at once"               expect bob 'curl -sS --max-time 3 https://registry.npmjs.org/x' 'served-by'
check "ask: a deny entry is never asked"         bash -c "! '$AH' exec bob -- curl -sS --max-time 5 https://evil.example.org/ 2>/dev/null && ! '$AH' approvals | grep -q evil.example.org"
check "ask: the metadata address is never asked" bash -c "! '$AH' exec bob -- curl -sSf -o /dev/null --max-time 5 http://169.254.169.254/ 2>/dev/null && ! '$AH' approvals | grep -q 169.254"
check "ask: requests and answers are recorded"   bash -c "'$AH' log --json --agent bob --kind approval --limit 0 | grep -q '\"reason\":\"approved always by'"
"$AH" policy set bob --mode allowlist --allow www.example.com >/dev/null

# The values never show anywhere but in requests to their hosts.
no_secret() { ! grep -qE -- "$anthropic_key|$github_token" <<<"$("$@" 2>&1)"; }
check "no value in the log (JSON)"            no_secret "$AH" log --json --limit 0
check "no value in the log table"             no_secret "$AH" log --limit 0
check "no value in the metrics"               no_secret "$AH" metrics
check "no value in the secret list"           no_secret "$AH" secret list --json
check "no value in the sandbox environment"   no_secret "$AH" exec alice -- env
check "metrics count alice's records"         bash -c "'$AH' metrics | grep -qE '^agenthold_egress_records_total\\{agent=\"alice\"\\} [1-9]'"
check "denials are logged with a reason"      bash -c "'$AH' log --json --denied --limit 0 | grep -q '\"reason\":\"no allow entry matches the host\"'"
# The request log file is an audit trail: chained and sealed, it
# verifies, and a line changed in it is found.
logf="$(dirname "$(field data_dir)")/egress.jsonl"
check "audit: the request log verifies"          "$AH" audit verify "$logf"
tampered() { # tampered: a copy of the log with one record's agent changed is reported, at the line after it
	local t n out; t=$(mktemp); cp "$logf" "$t"
	n=$(grep -n '"agent":"' "$t" | sed -n 2p | cut -d: -f1)
	sed -i "${n}s/\"agent\":\"/\"agent\":\"x/" "$t"
	out=$("$AH" audit verify "$t"); local rc=$?; rm -f "$t"
	[ $rc -ne 0 ] && grep -qE "^TAMPERED .*:$((n + 1)): " <<<"$out" || { echo "$out"; return 1; }
}
check "audit: a changed line is found"           tampered
elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")

# Figures: median over 20 new connections from a sandbox of the TLS
# handshake (which curl's loading of the CA bundle dominates) and of the
# first response byte after it, intercepted and passed through.
median_ms() { sort -n | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]*1000}'; }
timings() { # timings AGENT URL: "handshake first-byte-after-handshake" per line
	in_sandbox alice "for i in \$(seq 20); do curl -sS -o /dev/null -w '%{time_appconnect} %{time_starttransfer}\n' --noproxy '*' $1; done" |
		awk '{print $1, $2 - $1}'
}
int_t=$(timings "https://api.anthropic.com/v1/models")
pass_t=$(timings "https://registry.npmjs.org/x")

echo
echo "checks: $pass passed, $fail failed, in ${elapsed}s"
echo "figures (median of 20 new connections from a sandbox):"
echo "  passed through: TLS handshake $(cut -d' ' -f1 <<<"$pass_t" | median_ms) ms, then first byte $(cut -d' ' -f2 <<<"$pass_t" | median_ms) ms"
echo "  intercepted:    TLS handshake $(cut -d' ' -f1 <<<"$int_t" | median_ms) ms, then first byte $(cut -d' ' -f2 <<<"$int_t" | median_ms) ms"
[ "$fail" -eq 0 ]
