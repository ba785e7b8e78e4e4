// Package consolecheck drives agenthold's web console in headless
// Chromium against a running dev stack (make dev), as an operator would:
// log in, watch a denial arrive live, answer an approval while a
// sandbox's curl waits, apply a suggestion, and fail to change anything
// without the CSRF token or after logging out. It writes a screenshot of
// each page to the folder it names. It is a module of its own, so that
// chromedp is nobody else's dependency; make e2e-console runs it inside
// the gateway's network namespace, where the console listens.
package consolecheck

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	defaultStateFile = "/run/agenthold-dev/state.json"
	console          = "http://127.0.0.1:8088"
)

// stateFile is the dev stack's (make dev's DEV_STATE), as
// AGENTHOLD_DEV_STATE names it.
func stateFile() string {
	if s := os.Getenv("AGENTHOLD_DEV_STATE"); s != "" {
		return s
	}
	return defaultStateFile
}

type devState struct {
	Binary string `json:"binary"`
	Socket string `json:"socket"`
}

type stack struct {
	t     *testing.T
	state devState
	shots string
}

// ah runs the agenthold CLI against the dev stack.
func (s *stack) ah(args ...string) (string, error) {
	cmd := exec.Command(s.state.Binary, args...)
	cmd.Env = append(os.Environ(), "AGENTHOLD_SOCKET="+s.state.Socket)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *stack) mustAH(args ...string) string {
	s.t.Helper()
	out, err := s.ah(args...)
	require.NoError(s.t, err, "agenthold %s: %s", strings.Join(args, " "), out)
	return out
}

// shot writes a screenshot of the page to the folder.
func (s *stack) shot(ctx context.Context, name string) {
	s.t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: a PNG
	require.NoError(s.t, err)
	require.NoError(s.t, os.WriteFile(filepath.Join(s.shots, name+".png"), png, 0o644))
}

func TestConsoleInABrowser(t *testing.T) {
	data, err := os.ReadFile(stateFile())
	if os.IsNotExist(err) {
		t.Skip("no dev stack (make dev): make e2e-console starts one")
	}
	require.NoError(t, err)
	s := &stack{t: t}
	require.NoError(t, json.Unmarshal(data, &s.state))
	s.shots = os.Getenv("CONSOLE_SHOTS")
	if s.shots == "" {
		s.shots = filepath.Join(os.TempDir(), "agenthold-console-shots")
	}
	require.NoError(t, os.MkdirAll(s.shots, 0o755))
	t.Logf("screenshots of each page: %s", s.shots)

	token := strings.TrimSpace(s.mustAH("ui", "token"))
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.NoSandbox, chromedp.Flag("window-size", "1400,900"))
	if p := os.Getenv("CHROMIUM"); p != "" {
		opts = append(opts, chromedp.ExecPath(p))
	}
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// The suggestion's confirmation: accepted, as an operator would.
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}))

	// Log in.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(console+"/login")))
	s.shot(ctx, "1-login")
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys("#token", token), chromedp.Click("#login"), chromedp.WaitVisible("#agents")))
	s.shot(ctx, "2-agents")
	agents, err := chromedp.Run(ctx, chromedp.Text("#agents"))
	require.NoError(t, err)
	assert.Contains(t, agents, "alice")
	assert.Contains(t, agents, "anthropic as $ANTHROPIC_API_KEY", "secrets by name")

	// A denial appears live.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(console+"/traffic"), chromedp.WaitVisible("#traffic")))
	name := fmt.Sprintf("denied-%d.example.org", time.Now().UnixNano())
	start := time.Now()
	s.ah("exec", "bob", "--", "curl", "-sS", "--max-time", "3", "https://"+name+"/")
	asked := time.Since(start)
	live, cancelLive := context.WithTimeout(ctx, time.Second)
	err = chromedp.Do(live, chromedp.WaitVisible(fmt.Sprintf(`//tr[@data-host=%q]`, name)))
	cancelLive()
	require.NoError(t, err, "the denial did not appear within 1 s of the request")
	t.Logf("the denial of %s appeared %s after the sandbox's curl returned (which took %s)", name, (time.Since(start) - asked).Round(time.Millisecond), asked.Round(time.Millisecond))
	s.shot(ctx, "3-traffic")

	// A held request approved from the approvals page.
	s.mustAH("policy", "set", "bob", "--mode", "ask", "--allow", "www.example.com")
	defer s.ah("policy", "set", "bob", "--mode", "allowlist", "--allow", "www.example.com")
	curl := make(chan string, 1)
	go func() {
		out, _ := s.ah("exec", "bob", "--", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20", "https://echo.example.com/")
		curl <- out
	}()
	once := `//tr[td/code[text()="echo.example.com"]]//button[@class="answer-once"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(console+"/approvals"), chromedp.WaitVisible(once)))
	s.shot(ctx, "4-approvals")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(once)))
	assert.Equal(t, "200", <-curl, "the sandbox's curl, approved from the console")

	// A suggestion applied.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(console+"/suggest?agent=bob"), chromedp.WaitVisible("#diff")))
	s.shot(ctx, "5-suggest")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click("#apply-button"), chromedp.WaitVisible("#agents")))
	policy := s.mustAH("policy", "show", "bob")
	assert.Contains(t, policy, "allowlist", "the suggestion was applied: %s", policy)
	assert.Contains(t, policy, "echo.example.com", "what bob used, approved, is in its policy: %s", policy)

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(console+"/health"), chromedp.WaitVisible("#chart")))
	s.shot(ctx, "6-health")

	// No change without the CSRF token, nor with it after logging out.
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch("/suggest", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "agent=bob", redirect: "manual"}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, 403, status, "a change without the CSRF token")
	csrf, err := chromedp.Run(ctx, chromedp.AttributeValue("body", "data-csrf"))
	require.NoError(t, err)
	require.NotEmpty(t, csrf.Value)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click("#logout"), chromedp.WaitVisible("#token")))
	kind, err := chromedp.Run(ctx, chromedp.Evaluate[string](`fetch("/suggest", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "agent=bob&csrf=`+csrf.Value+`", redirect: "manual"}).then(r => r.type)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, "opaqueredirect", kind, "a change after logging out is sent to the login page")
}
