//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMakeRunShowsCluster runs what `make run` runs (the Makefile's run
// recipe, with the built binary as bin/shoal in a directory laid out like
// the repository root, on free ports), waits for the banner, then runs
// every command line the banner prints exactly as printed (through sh -c,
// from that directory; chat with a prompt on stdin), each of which must
// exit 0. The built-in model must run on more than one node, as the
// banner's model line, 'model ls' and 'placement show' all say. Ctrl-C
// then stops every agent and removes the up file.
func TestMakeRunShowsCluster(t *testing.T) {
	line := makeRunLine(t)
	if !strings.HasPrefix(line, "bin/shoal up") {
		t.Fatalf("make run runs %q, not bin/shoal up", line)
	}
	up := startUp(t, line+" --port "+freeBase(t))
	banner := up.banner

	// The model line: which node runs which layers, over every agent.
	var modelLine string
	for _, l := range banner {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "model ") {
			modelLine = s
		}
	}
	if !strings.Contains(modelLine, ": pipeline, ") || countNodes(modelLine) != 3 {
		t.Fatalf("the banner's model line does not show a pipeline over 3 nodes: %q\n%s", modelLine, strings.Join(banner, "\n"))
	}
	model := strings.TrimSuffix(strings.Fields(modelLine)[1], ":")

	cmds := bannerCommands(banner)
	var shown []string
	for _, c := range cmds {
		shown = append(shown, verb(c))
	}
	for _, want := range []string{"curl", "status", "chat", "model", "placement"} {
		if !slices.Contains(shown, want) {
			t.Fatalf("the banner prints no %s line; its commands: %q", want, cmds)
		}
	}
	outputs := map[string]string{}
	for _, c := range cmds {
		stdin := ""
		if verb(c) == "chat" {
			stdin = "Hello\n"
		}
		var out string
		t0 := time.Now()
		if strings.HasPrefix(c, "curl ") {
			out = runCurl(t, up.dir, c)
		} else {
			var err error
			if out, err = runLine(up.dir, c, stdin); err != nil {
				t.Fatalf("the banner's line %q failed: %v\n%s", c, err, out)
			}
		}
		t.Logf("$ %s   (exit 0, %v)\n%s", c, time.Since(t0).Round(time.Millisecond), out)
		outputs[verb(c)] = out
	}
	if strings.TrimSpace(outputs["chat"]) == "" {
		t.Fatal("bin/shoal chat printed no answer")
	}
	if !strings.Contains(outputs["status"], "3 alive of 3") {
		t.Fatalf("bin/shoal status does not show 3 live nodes:\n%s", outputs["status"])
	}

	// model ls: the model's shards on every node, each ready.
	ls := outputs["model"]
	shards := regexp.MustCompile(`(node-\d+)\s+\[(\d+),(\d+)\)\s+ready`).FindAllStringSubmatch(ls, -1)
	var lsNodes []string
	for _, m := range shards {
		if !slices.Contains(lsNodes, m[1]) {
			lsNodes = append(lsNodes, m[1])
		}
	}
	if !strings.Contains(ls, model) || len(lsNodes) < 2 {
		t.Fatalf("bin/shoal model ls does not show %s ready on more than one node:\n%s", model, ls)
	}
	// placement show: one stage per node, and the banner said the same.
	ps := outputs["placement"]
	stages := regexp.MustCompile(`(?m)^\d+\s+\[(\d+),(\d+)\)\s+(node-\d+)\s`).FindAllStringSubmatch(ps, -1)
	if !strings.Contains(ps, "strategy pipeline") || len(stages) < 2 {
		t.Fatalf("bin/shoal placement show does not show a pipeline over more than one node:\n%s", ps)
	}
	for _, st := range stages {
		lo, _ := strconv.Atoi(st[1])
		hi, _ := strconv.Atoi(st[2])
		want := fmt.Sprintf("%s layers %d-%d", st[3], lo, hi-1)
		if hi-lo == 1 {
			want = fmt.Sprintf("%s layer %d", st[3], lo)
		}
		if !strings.Contains(modelLine, want) {
			t.Errorf("placement show has stage %s [%d,%d) but the banner says %q", st[3], lo, hi, modelLine)
		}
	}

	up.interrupt(t)
}

// TestCLIMisuse: every misuse of the CLI, run as the built binary, exits
// non-zero with one line on stderr that says why.
func TestCLIMisuse(t *testing.T) {
	up := startUp(t, "bin/shoal up --nodes 1 --port "+freeBase(t))
	closed := closedPort(t)
	missing := filepath.Join(t.TempDir(), "missing.gguf")
	for _, tc := range []struct {
		name, line, stdin string
		reason            *regexp.Regexp
	}{
		{"unknown command", "bin/shoal frobnicate", "", regexp.MustCompile(`unknown command "frobnicate"`)},
		{"unknown subcommand", "bin/shoal model rm x", "", regexp.MustCompile(`unknown command "rm" for "shoal model"`)},
		{"unknown flag", "bin/shoal status --bogus", "", regexp.MustCompile(`unknown flag: --bogus`)},
		{"chat with an unknown model", "bin/shoal chat -m nosuch", "Hello\n", regexp.MustCompile("nosuch")},
		{"load a missing file", "bin/shoal model load " + missing, "", regexp.MustCompile(`not found.*missing\.gguf`)},
		{"placement of an unknown model", "bin/shoal placement show nosuch", "", regexp.MustCompile(`"nosuch" is not loaded`)},
		{"no agent listening", "bin/shoal status --addr 127.0.0.1:" + closed, "", regexp.MustCompile(`cannot reach agent at http://127\.0\.0\.1:` + closed)},
		{"chat with no agent listening", "bin/shoal chat --addr 127.0.0.1:" + closed, "Hello\n", regexp.MustCompile(`connection refused`)},
		{"bad token", "bin/shoal status --token wrong", "", regexp.MustCompile(`invalid API key`)},
		{"chat with a bad token", "bin/shoal chat --token wrong", "Hello\n", regexp.MustCompile(`(?i)incorrect API key`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "sh", "-c", tc.line)
			cmd.Dir, cmd.Env = up.dir, cliEnv()
			cmd.Stdin = strings.NewReader(tc.stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("%s: exit %v, want a non-zero exit\nstdout: %s\nstderr: %s", tc.line, err, stdout.String(), stderr.String())
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "shoal: ") || !tc.reason.MatchString(lines[0]) {
				t.Fatalf("%s: stderr is not one line matching %q:\n%s", tc.line, tc.reason, stderr.String())
			}
			t.Logf("%s: exit %d: %s", tc.line, ee.ExitCode(), lines[0])
		})
	}
	up.interrupt(t)
}

// buildShoal builds the shoal binary into dir/bin/shoal, where `make
// build` puts it in the repository.
func buildShoal(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", "shoal"), "shoal/cmd/shoal")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
}

// makeRunLine is the command of the Makefile's run target, $(BIN)
// replaced by its value.
func makeRunLine(t *testing.T) string {
	b, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	var recipe string
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if m := regexp.MustCompile(`^(\w+)\s*[:?]?=\s*(.*)$`).FindStringSubmatch(l); m != nil {
			vars[m[1]] = strings.TrimSpace(m[2])
		}
		if strings.HasPrefix(l, "run:") && i+1 < len(lines) {
			recipe = strings.TrimSpace(lines[i+1])
		}
	}
	if recipe == "" {
		t.Fatal("the Makefile has no run target")
	}
	return regexp.MustCompile(`\$\((\w+)\)`).ReplaceAllStringFunc(recipe, func(v string) string {
		return vars[v[2:len(v)-1]]
	})
}

// cliEnv is the environment without SHOAL_ADDR, SHOAL_TOKEN or
// SHOAL_CACERT, so the CLI finds the cluster as a user's shell would.
func cliEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOAL_ADDR=") && !strings.HasPrefix(kv, "SHOAL_TOKEN=") && !strings.HasPrefix(kv, "SHOAL_CACERT=") {
			env = append(env, kv)
		}
	}
	return env
}

// upRun is a running `shoal up` started from dir.
type upRun struct {
	dir    string
	cmd    *exec.Cmd
	banner []string // stdout up to "Ctrl-C stops the cluster."
	stderr *lockedBuffer
	done   chan error
	ended  bool // its exit was received from done
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startUp builds bin/shoal into a fresh directory and runs line there
// (through sh, which execs it: the process is shoal up itself, run as
// bin/shoal), then waits for the banner.
func startUp(t *testing.T, line string) *upRun {
	t.Helper()
	dir := t.TempDir()
	buildShoal(t, dir)
	u := &upRun{dir: dir, stderr: &lockedBuffer{}, done: make(chan error, 1)}
	u.cmd = exec.Command("sh", "-c", "exec "+line)
	u.cmd.Dir, u.cmd.Env = dir, cliEnv()
	stdout, err := u.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	u.cmd.Stderr = u.stderr
	t0 := time.Now()
	if err := u.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		u.done <- u.cmd.Wait()
	}()
	t.Cleanup(func() {
		if !u.ended {
			u.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-u.done:
			case <-time.After(30 * time.Second):
				u.cmd.Process.Kill()
			}
		}
	})
	timeout := time.After(120 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				<-u.done
				u.ended = true
				t.Fatalf("%s exited before it was ready:\n%s\n%s", line, strings.Join(u.banner, "\n"), u.stderr.String())
			}
			u.banner = append(u.banner, l)
			if strings.HasPrefix(strings.TrimSpace(l), "Ctrl-C stops the cluster") {
				t.Logf("%s: ready in %v\n%s", line, time.Since(t0).Round(time.Millisecond), strings.Join(u.banner, "\n"))
				go func() {
					for range lines {
					}
				}()
				return u
			}
		case <-timeout:
			t.Fatalf("%s was not ready within 120 s:\n%s\n%s", line, strings.Join(u.banner, "\n"), u.stderr.String())
		}
	}
}

// interrupt sends Ctrl-C: shoal up must exit 0 within 30 s, every agent
// it started (the pids its log names) must be gone, and its up file too.
func (u *upRun) interrupt(t *testing.T) {
	t.Helper()
	var pids []int
	for _, m := range regexp.MustCompile(`started node-\d+ \(pid (\d+)`).FindAllStringSubmatch(u.stderr.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		t.Fatalf("shoal up named no agent pids:\n%s", u.stderr.String())
	}
	t0 := time.Now()
	if err := u.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	defer func() { t.Logf("Ctrl-C: shoal up stopped in %v", time.Since(t0).Round(time.Millisecond)) }()
	select {
	case err := <-u.done:
		u.ended = true
		if err != nil {
			t.Fatalf("shoal up exited with %v after Ctrl-C:\n%s", err, u.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("shoal up did not stop within 30 s of Ctrl-C:\n%s", u.stderr.String())
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("agent pid %d still running after shoal up stopped (%v)", pid, err)
		}
	}
	if _, err := os.Stat(filepath.Join(u.dir, ".shoal", "up", "cluster.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the up file is still there after Ctrl-C (%v)", err)
	}
}

// bannerCommands are the command lines the banner prints: each line
// starting with bin/shoal (its comment kept: sh ignores it) and the curl
// line with its continuation joined.
func bannerCommands(banner []string) []string {
	var out []string
	var curl []string
	for _, l := range banner {
		s := strings.TrimSpace(l)
		switch {
		case len(curl) > 0:
			curl = append(curl, strings.TrimSuffix(s, "\\"))
			if !strings.HasSuffix(s, "\\") {
				out = append(out, strings.Join(curl, " "))
				curl = nil
			}
		case strings.HasPrefix(s, "curl "):
			curl = []string{strings.TrimSuffix(s, "\\")}
			if !strings.HasSuffix(s, "\\") {
				out = append(out, s)
				curl = nil
			}
		case strings.HasPrefix(s, "bin/shoal "):
			out = append(out, s)
		}
	}
	return out
}

// runLine runs a command line through sh -c in dir, exactly as printed,
// and returns its stdout (and, when it fails, its stderr in the error).
func runLine(dir, line, stdin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir, cmd.Env = dir, cliEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%w; stderr:\n%s", err, stderr.String())
	}
	return string(out), err
}

// runCurl runs the banner's curl line through sh -c (or, without curl,
// makes the same request in Go) and checks that a completion came back.
func runCurl(t *testing.T, dir, line string) string {
	t.Helper()
	var out []byte
	if _, err := exec.LookPath("curl"); err == nil {
		s, err := runLine(dir, line, "")
		if err != nil {
			t.Fatalf("the banner's curl line failed: %v\n%s", err, s)
		}
		out = []byte(s)
	} else {
		t.Log("curl is not installed: making the curl line's request in Go")
		m := regexp.MustCompile(`^curl (\S+) -H '([^']*)'\s+-d '([^']*)'$`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("cannot read the curl line %q", line)
		}
		req, _ := http.NewRequest("POST", m[1], strings.NewReader(m[3]))
		k, v, _ := strings.Cut(m[2], ": ")
		req.Header.Set(k, v)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends it
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out, err = io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	var resp struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &resp); err != nil || len(resp.Choices) != 1 || resp.Usage.CompletionTokens == 0 {
		t.Fatalf("the curl line did not get a completion (%v):\n%s", err, out)
	}
	return string(out)
}

// verb is what a banner line runs: curl, or the shoal command (status,
// chat, model, placement).
func verb(line string) string {
	if strings.HasPrefix(line, "curl ") {
		return "curl"
	}
	return strings.Fields(line)[1]
}

// countNodes counts the distinct node-N names in s.
func countNodes(s string) int {
	var seen []string
	for _, n := range regexp.MustCompile(`node-\d+`).FindAllString(s, -1) {
		if !slices.Contains(seen, n) {
			seen = append(seen, n)
		}
	}
	return len(seen)
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}
