//go:build unix

package docs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"shoal/hub/hubtest"
)

// The limits of one page's blocks. The whole guide runs in well under two
// minutes on two cores; these bound a block that hangs.
const (
	blockTimeout = 90 * time.Second  // one block
	readyTimeout = 120 * time.Second // a background block's ready command
	stopTimeout  = 30 * time.Second  // Ctrl-C to exit, after the page
)

// shoalBin is the shoal binary TestMain builds.
var shoalBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shoal-docs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shoalBin = filepath.Join(dir, "shoal")
	cmd := exec.Command("go", "build", "-o", shoalBin, "shoal/cmd/shoal")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "docs: building shoal: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pages are the files whose blocks run: README.md and docs/*.md.
func pages(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(md)
	return append([]string{"../README.md"}, md...)
}

// block is one fenced code block of a page.
type block struct {
	line       int    // of the opening fence, 1-based
	lang       string // the info string's first word
	body       string
	notRun     string   // <!-- not run: REASON -->
	needs      []string // <!-- needs: PROG ... -->
	background bool     // <!-- background, ready: COMMAND -->
	ready      string
	exit       int // <!-- exit status: N REASON -->: a background block's expected status
}

func (b block) shell() bool { return b.lang == "sh" || b.lang == "bash" || b.lang == "shell" }

var (
	fenceRE     = regexp.MustCompile("^(\\s*)(```+|~~~+)\\s*(.*)$")
	commentRE   = regexp.MustCompile(`^\s*<!--\s*(.*?)\s*-->\s*$`)
	notRunRE    = regexp.MustCompile(`^not run:\s*(\S.*)$`)
	needsRE     = regexp.MustCompile(`^needs:\s*(\S.*)$`)
	backgroundR = regexp.MustCompile(`^background,\s*ready:\s*(\S.*)$`)
	exitRE      = regexp.MustCompile(`^exit status:\s*(\d+)\b\s*(.*)$`)
)

// parse reads the fenced blocks of a Markdown file and the directives in
// the HTML comments on the lines right above each.
func parse(name string, src []byte) ([]block, error) {
	var blocks []block
	var errs []error
	var pending []string // directive comments right above the current line
	lines := strings.Split(string(src), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := commentRE.FindStringSubmatch(l); m != nil {
			pending = append(pending, m[1])
			continue
		}
		m := fenceRE.FindStringSubmatch(l)
		if m == nil {
			pending = nil
			continue
		}
		indent, fence := m[1], m[2]
		b := block{line: i + 1}
		if f := strings.Fields(m[3]); len(f) > 0 {
			b.lang = f[0]
		}
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			if strings.HasPrefix(strings.TrimSpace(lines[i]), fence) && strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(lines[i]), fence[:1])) == "" {
				closed = true
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		if !closed {
			errs = append(errs, fmt.Errorf("%s:%d: the block is never closed", name, b.line))
		}
		b.body = strings.Join(body, "\n") + "\n"
		if b.lang == "" {
			errs = append(errs, fmt.Errorf("%s:%d: a fence without a language: sh to run it, text for output or sketches", name, b.line))
		}
		for _, d := range pending {
			switch {
			case notRunRE.MatchString(d):
				b.notRun = notRunRE.FindStringSubmatch(d)[1]
			case needsRE.MatchString(d):
				b.needs = append(b.needs, strings.Fields(needsRE.FindStringSubmatch(d)[1])...)
			case backgroundR.MatchString(d):
				b.background, b.ready = true, backgroundR.FindStringSubmatch(d)[1]
			case exitRE.MatchString(d):
				b.exit, _ = strconv.Atoi(exitRE.FindStringSubmatch(d)[1])
			default:
				errs = append(errs, fmt.Errorf("%s:%d: the comment above the block is no directive (not run: REASON, needs: PROGS, background, ready: COMMAND): %q", name, b.line, d))
			}
		}
		if b.exit != 0 && !b.background {
			errs = append(errs, fmt.Errorf("%s:%d: an exit status is for a background block", name, b.line))
		}
		if b.background && strings.Count(strings.TrimSpace(b.body), "\n") > 0 {
			errs = append(errs, fmt.Errorf("%s:%d: a background block is one command line (it runs with exec, so that Ctrl-C reaches it as in a terminal)", name, b.line))
		}
		if len(pending) > 0 && !b.shell() {
			errs = append(errs, fmt.Errorf("%s:%d: directives above a %q block, which never runs", name, b.line, b.lang))
		}
		pending = nil
		blocks = append(blocks, b)
	}
	return blocks, errors.Join(errs...)
}

func TestParse(t *testing.T) {
	src := "x\n<!-- not run: needs real machines -->\n```sh\nshoal agent\n```\n\n" +
		"<!-- needs: curl -->\n<!-- background, ready: test -f f -->\n<!-- exit status: 3 removed below -->\n```sh\nshoal up\n```\n" +
		"- item\n\n  ```text\n  out\n  ```\n" +
		"```sh\nshoal --help\n```\n"
	blocks, err := parse("t.md", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 4 {
		t.Fatalf("%d blocks, want 4: %+v", len(blocks), blocks)
	}
	if b := blocks[0]; b.notRun != "needs real machines" || !b.shell() || b.body != "shoal agent\n" || b.line != 3 {
		t.Errorf("block 0: %+v", b)
	}
	if b := blocks[1]; !b.background || b.ready != "test -f f" || b.exit != 3 || !slices.Equal(b.needs, []string{"curl"}) {
		t.Errorf("block 1: %+v", b)
	}
	if b := blocks[2]; b.lang != "text" || b.body != "out\n" {
		t.Errorf("block 2: %+v", b)
	}
	if b := blocks[3]; b.notRun != "" || b.background || len(b.needs) > 0 {
		t.Errorf("block 3 took the directives of another block: %+v", b)
	}
	for _, bad := range []string{"```\nx\n```\n", "<!-- not-run -->\n```sh\nx\n```\n", "<!-- not run: x -->\n```text\nx\n```\n", "```sh\nx\n", "<!-- exit status: 1 -->\n```sh\nx\n```\n", "<!-- background, ready: true -->\n```sh\na\nb\n```\n"} {
		if _, err := parse("bad.md", []byte(bad)); err == nil {
			t.Errorf("parse accepted %q", bad)
		}
	}
}

// TestDocs runs every page's shell blocks, the pages side by side (as many
// as -parallel allows), the blocks of a page in order.
func TestDocs(t *testing.T) {
	hub := fakeHub(t)
	for _, page := range pages(t) {
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parse(page, src)
		if err != nil {
			t.Error(err)
			continue
		}
		name := filepath.Base(page) // README.md is the repository's, docs_README.md the guide's
		if page == "README.md" {
			name = "docs_README.md"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runPage(t, blocks, hub)
		})
	}
}

// fakeHub serves, under the repository the pages pull from, a small random
// qwen2 model made with the built binary.
func fakeHub(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "qwen.gguf")
	cmd := exec.Command(shoalBin, "gen-model", "--arch", "qwen2", "--n-ff", "768", "--type", "q4_k_m", "--name", "Qwen2.5 0.5B Instruct (random weights)", "-q", "--out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, b)
	}
	gguf, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	h := hubtest.New(t)
	h.AddRepo("Qwen/Qwen2.5-0.5B-Instruct-GGUF", map[string][]byte{"qwen2.5-0.5b-instruct-q4_k_m.gguf": gguf})
	return h.URL
}

// page is one page's run: its directories, ports and background blocks.
type page struct {
	dir, home string
	envFile   string // the variables the blocks exported so far
	port      int
	env       []string
	bg        []*bgProc
}

type bgProc struct {
	line int
	exit int // the exit status it should end with
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

func runPage(t *testing.T, blocks []block, hubURL string) {
	root := t.TempDir()
	p := &page{dir: filepath.Join(root, "work"), home: filepath.Join(root, "home"), envFile: filepath.Join(root, "exported"), port: freeBase(t)}
	for _, d := range []string{p.dir, p.home, filepath.Join(p.dir, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(p.envFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// bin/shoal, where make build puts it, for the README's lines.
	if err := os.Symlink(shoalBin, filepath.Join(p.dir, "bin", "shoal")); err != nil {
		t.Fatal(err)
	}
	p.env = pageEnv(p.home, hubURL)
	// curl fails on an HTTP error, as a reader would notice one.
	if err := os.WriteFile(filepath.Join(p.home, ".curlrc"), []byte(curlrc()), 0o644); err != nil {
		t.Fatal(err)
	}
	defer p.stop(t)
	t.Logf("working directory %s, HOME %s, ports from %d", p.dir, p.home, p.port)

	gone := "" // why the page's cluster is not there: later blocks skip
	for _, b := range blocks {
		if !b.shell() {
			continue
		}
		t.Run("line"+strconv.Itoa(b.line), func(t *testing.T) {
			switch {
			case b.notRun != "":
				t.Skipf("not run: %s", b.notRun)
			case gone != "":
				t.Skipf("not run: %s", gone)
			}
			for _, prog := range b.needs {
				if _, err := exec.LookPath(prog); err != nil {
					t.Skipf("needs %s, which is not installed", prog)
				}
			}
			script := p.rewrite(b.body, b.background)
			if b.background {
				if testing.Short() {
					gone = fmt.Sprintf("the block at line %d starts a cluster, skipped with -short", b.line)
					t.Skip("starts a cluster: skipped with -short")
				}
				b.ready = p.rewrite(b.ready, false)
				if err := p.start(t, b, "exec "+strings.TrimSpace(script)); err != nil {
					gone = fmt.Sprintf("the block at line %d did not get ready", b.line)
					t.Fatal(err)
				}
				return
			}
			p.run(t, b, script)
		})
	}
}

// curlrc makes curl exit non-zero on an HTTP error, showing the body
// where this curl can (7.76 or later).
func curlrc() string {
	out, _ := exec.Command("curl", "--help", "all").Output()
	if bytes.Contains(out, []byte("--fail-with-body")) {
		return "fail-with-body\nshow-error\n"
	}
	return "fail\nshow-error\n"
}

// pageEnv is the environment of a page's blocks: the test's own, less what
// would point shoal at another cluster, store or hub, with the built
// binary first on PATH and a HOME of its own.
func pageEnv(home, hubURL string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SHOAL_") || strings.HasPrefix(k, "HF_") || k == "HUGGING_FACE_HUB_TOKEN" || k == "HOME" || k == "PATH" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home, "PATH="+filepath.Dir(shoalBin)+":"+os.Getenv("PATH"), "HF_ENDPOINT="+hubURL)
}

var (
	portRE = regexp.MustCompile(`(:|-port[ =])(80[89]\d|810\d)\b`)
	upRE   = regexp.MustCompile(`\bshoal up\b`)
)

// rewrite moves the block's ports onto the page's: shoal up (in a
// background block) gets --port, and ports 8080 to 8109 (after a colon, as
// in 127.0.0.1:8080, or after a --*-port flag) follow it.
func (p *page) rewrite(body string, background bool) string {
	body = portRE.ReplaceAllStringFunc(body, func(s string) string {
		m := portRE.FindStringSubmatch(s)
		n, _ := strconv.Atoi(m[2])
		return m[1] + strconv.Itoa(p.port+n-8080)
	})
	if background {
		body = upRE.ReplaceAllString(body, "shoal up --port "+strconv.Itoa(p.port))
	}
	return body
}

// command runs script through sh -e in the page's directory, with the
// variables earlier blocks exported, as in one terminal.
func (p *page) command(ctx context.Context, script string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "sh", "-e", "-c", ". "+p.envFile+"\n"+script)
	cmd.Dir, cmd.Env = p.dir, p.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs a block to its end: it must exit 0 within blockTimeout.
func (p *page) run(t *testing.T, b block, script string) {
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := p.command(ctx, script+"\nexport -p > "+p.envFile+".new && mv "+p.envFile+".new "+p.envFile)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(t0).Round(time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("did not finish within %v:\n$ %s%s", blockTimeout, script, tail(string(out)))
	}
	if err != nil {
		for _, bg := range p.bg {
			select {
			case <-bg.done:
				t.Logf("the background block at line %d has stopped (%v):%s", bg.line, bg.err, tail(bg.out.String()))
			default:
			}
		}
		t.Fatalf("%v after %v:\n$ %s%s", err, took, script, tail(string(out)))
	}
	t.Logf("exit 0 after %v:\n$ %s%s", took, script, tail(string(out)))
}

// start starts a background block and waits until its ready command
// exits 0.
func (p *page) start(t *testing.T, b block, script string) error {
	bg := &bgProc{line: b.line, exit: b.exit, out: &lockedBuffer{}, done: make(chan struct{})}
	bg.cmd = p.command(context.Background(), script)
	bg.cmd.Stdout, bg.cmd.Stderr = bg.out, bg.out
	if err := bg.cmd.Start(); err != nil {
		return err
	}
	p.bg = append(p.bg, bg)
	go func() { bg.err = bg.cmd.Wait(); close(bg.done) }()
	t0 := time.Now()
	for time.Since(t0) < readyTimeout {
		select {
		case <-bg.done:
			return fmt.Errorf("exited (%v) before %q succeeded:\n$ %s%s", bg.err, b.ready, script, tail(bg.out.String()))
		case <-time.After(250 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := p.command(ctx, b.ready).Run()
		cancel()
		if err == nil {
			t.Logf("ready after %v:\n$ %s%s", time.Since(t0).Round(time.Millisecond), script, tail(bg.out.String()))
			return nil
		}
	}
	return fmt.Errorf("%q did not succeed within %v:\n$ %s%s", b.ready, readyTimeout, script, tail(bg.out.String()))
}

// stop sends the page's background blocks Ctrl-C (SIGINT to the process
// group, as a terminal does), newest first, and waits for them to exit
// with the status they should (0 unless an exit status directive says).
func (p *page) stop(t *testing.T) {
	for i := len(p.bg) - 1; i >= 0; i-- {
		bg := p.bg[i]
		how := "on its own"
		select {
		case <-bg.done:
		default:
			t0 := time.Now()
			syscall.Kill(-bg.cmd.Process.Pid, syscall.SIGINT)
			select {
			case <-bg.done:
				how = fmt.Sprintf("after Ctrl-C, in %v", time.Since(t0).Round(time.Millisecond))
			case <-time.After(stopTimeout):
				syscall.Kill(-bg.cmd.Process.Pid, syscall.SIGKILL)
				<-bg.done
				t.Errorf("the block at line %d did not stop within %v of Ctrl-C:%s", bg.line, stopTimeout, tail(bg.out.String()))
				continue
			}
		}
		code := 0
		var ee *exec.ExitError
		if errors.As(bg.err, &ee) {
			code = ee.ExitCode()
		} else if bg.err != nil {
			code = -1
		}
		if code != bg.exit {
			t.Errorf("the block at line %d stopped %s with %v, want exit status %d:%s", bg.line, how, bg.err, bg.exit, tail(bg.out.String()))
			continue
		}
		t.Logf("the block at line %d stopped %s, exit status %d", bg.line, how, code)
	}
}

// tail is the end of a command's output, for the log.
func tail(s string) string {
	const max = 3000
	if s == "" {
		return ""
	}
	if len(s) > max {
		s = "...\n" + s[len(s)-max:]
	}
	return "\n" + strings.TrimRight(s, "\n")
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

// freeBase is a port P with P..P+29 free on loopback (TCP and UDP): shoal
// up's agent i uses P+10i (HTTP), +1 (QUIC), +2 (gossip). It starts at a
// random place so that test binaries running side by side do not race for
// the same ports.
func freeBase(t *testing.T) int {
	t.Helper()
	start := 20000 + 100*rand.IntN(400)
	for k := 0; k < 400; k++ {
		base := 20000 + (start-20000+100*k)%40000
		if portsFree(base, 30) {
			return base
		}
	}
	t.Fatal("no 30 free loopback ports")
	return 0
}

func portsFree(base, n int) bool {
	for i := 0; i < n; i++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		u.Close()
	}
	return true
}

// TestCLIPage checks docs/cli.md against the binary: every command (and
// subcommand) that --help lists has a section headed with its name, every
// flag of the command is named in its section, and each flag of a
// section's table exists, with the default --help gives.
func TestCLIPage(t *testing.T) {
	src, err := os.ReadFile("cli.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := cliSections(string(src))
	cmds := commands(t, nil)
	for _, c := range cmds {
		name := strings.Join(append([]string{"shoal"}, c...), " ")
		sec, ok := sections[name]
		if !ok {
			t.Errorf("cli.md has no section headed `%s`", name)
			continue
		}
		flags := helpFlags(t, c)
		for f := range flags {
			if !regexp.MustCompile(`--` + regexp.QuoteMeta(f) + `\b`).MatchString(sec) {
				t.Errorf("cli.md, `%s`: flag --%s is not named", name, f)
			}
		}
		for _, row := range flagRows(sec) {
			for _, f := range row.flags {
				def, ok := flags[f]
				if !ok {
					t.Errorf("cli.md, `%s`: the table names --%s, which the command does not have", name, f)
					continue
				}
				if def != "" && len(row.flags) == 1 && !strings.Contains(row.def, def) {
					t.Errorf("cli.md, `%s`: --%s defaults to %s (--help), the table says %q", name, f, def, row.def)
				}
			}
		}
	}
	for name := range sections {
		found := false
		for _, c := range cmds {
			found = found || name == strings.Join(append([]string{"shoal"}, c...), " ")
		}
		if !found {
			t.Errorf("cli.md has a section for `%s`, which --help does not list", name)
		}
	}
}

var headingRE = regexp.MustCompile("(?m)^#{2,4} `(shoal(?: [a-z-]+)*)`")

// cliSections maps each command heading of the CLI page to its text (up to
// the next command heading).
func cliSections(src string) map[string]string {
	out := map[string]string{}
	idx := headingRE.FindAllStringSubmatchIndex(src, -1)
	for i, m := range idx {
		end := len(src)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		out[src[m[2]:m[3]]] = src[m[1]:end]
	}
	return out
}

type flagRow struct {
	flags []string // the flags the first cell names
	def   string   // the second cell
}

var (
	rowRE      = regexp.MustCompile("(?m)^\\| (`-[^|]*)\\|([^|]*)\\|")
	rowFlagRE  = regexp.MustCompile(`--([a-z0-9-]+)`)
	defaultRE  = regexp.MustCompile(`\(default ([^:);][^);]*)[^)]*\)\s*$`)
	helpFlagRE = regexp.MustCompile(`^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)(.*)$`)
)

// flagRows are the rows of a section's flag tables: | `--flag ARG` | default | what |.
func flagRows(sec string) []flagRow {
	var rows []flagRow
	for _, m := range rowRE.FindAllStringSubmatch(sec, -1) {
		r := flagRow{def: strings.TrimSpace(m[2])}
		for _, f := range rowFlagRE.FindAllStringSubmatch(m[1], -1) {
			r.flags = append(r.flags, f[1])
		}
		rows = append(rows, r)
	}
	return rows
}

// commands lists the command paths under path, from the Available
// Commands of each --help (help and completion left out).
func commands(t *testing.T, path []string) [][]string {
	t.Helper()
	help := helpOf(t, path)
	var out [][]string
	if len(path) > 0 {
		out = append(out, path)
	}
	sec, ok := helpSection(help, "Available Commands:")
	if !ok {
		return out
	}
	for _, l := range strings.Split(sec, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] == "help" || f[0] == "completion" {
			continue
		}
		out = append(out, commands(t, append(slices.Clone(path), f[0]))...)
	}
	return out
}

// helpFlags maps the flags of a command's --help (Flags:, not Global
// Flags; --help itself left out) to the default cobra prints ("" if none).
func helpFlags(t *testing.T, path []string) map[string]string {
	t.Helper()
	flags := map[string]string{}
	sec, _ := helpSection(helpOf(t, path), "Flags:")
	for _, l := range strings.Split(sec, "\n") {
		m := helpFlagRE.FindStringSubmatch(l)
		if m == nil || m[1] == "help" {
			continue
		}
		def := ""
		if d := defaultRE.FindStringSubmatch(m[2]); d != nil {
			def = strings.Trim(d[1], `"`)
		}
		flags[m[1]] = def
	}
	return flags
}

var helpCache sync.Map

func helpOf(t *testing.T, path []string) string {
	t.Helper()
	key := strings.Join(path, " ")
	if h, ok := helpCache.Load(key); ok {
		return h.(string)
	}
	out, err := exec.Command(shoalBin, append(slices.Clone(path), "--help")...).Output()
	if err != nil {
		t.Fatalf("shoal %s --help: %v", key, err)
	}
	helpCache.Store(key, string(out))
	return string(out)
}

// helpSection is the indented text under a heading of --help output.
func helpSection(help, heading string) (string, bool) {
	var b strings.Builder
	in, found := false, false
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == heading:
			in, found = true, true
		case in && (l == "" || !strings.HasPrefix(l, " ")):
			in = false
		case in:
			b.WriteString(l + "\n")
		}
	}
	return b.String(), found
}

// TestArchitecturePage checks docs/architecture.md against the tree: it
// names every top-level folder and every package, each package it names
// exists, and its dependency table has layout_test.go's mayImport rows.
func TestArchitecturePage(t *testing.T) {
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	out, err := exec.Command("go", "list", "-tags", "integration", "-f", "{{.ImportPath}}", "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(p, "shoal/")
		if !ok {
			continue
		}
		if !strings.Contains(page, "`"+rel+"`") && !strings.Contains(page, "`"+rel+"/`") {
			t.Errorf("architecture.md does not name package `%s`", rel)
		}
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9/]+?)/?` \\|").FindAllStringSubmatch(page, -1) {
		if st, err := os.Stat(filepath.Join("..", m[1])); err != nil || !st.IsDir() {
			t.Errorf("architecture.md has a row for `%s`, which is not a folder of the repository", m[1])
		}
	}
	if ls, err := exec.Command("git", "ls-files", "..").Output(); err == nil {
		seen := map[string]bool{}
		for _, f := range strings.Fields(string(ls)) {
			f = strings.TrimPrefix(f, "../")
			if top, _, dir := strings.Cut(f, "/"); dir && !strings.HasPrefix(top, ".") && !seen[top] {
				seen[top] = true
				if !strings.Contains(page, "`"+top+"/`") {
					t.Errorf("architecture.md does not name the top-level folder `%s/`", top)
				}
			}
		}
	}
	rows := mayImport(t)
	for from, to := range rows {
		m := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(from) + "` \\|([^|]*)\\|").FindStringSubmatch(page)
		if m == nil {
			t.Errorf("architecture.md's dependency table has no row for `%s` (layout_test.go: %v)", from, to)
			continue
		}
		var got []string
		for _, x := range regexp.MustCompile("`([a-z]+)`").FindAllStringSubmatch(m[1], -1) {
			got = append(got, x[1])
		}
		sort.Strings(got)
		sort.Strings(to)
		if !slices.Equal(got, to) {
			t.Errorf("architecture.md: `%s` may import %v, layout_test.go says %v", from, got, to)
		}
	}
}

// mayImport reads the mayImport table of ../layout_test.go.
func mayImport(t *testing.T) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../layout_test.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "mayImport" || len(vs.Values) != 1 {
			return true
		}
		lit, _ := vs.Values[0].(*ast.CompositeLit)
		if lit == nil {
			return false
		}
		for _, e := range lit.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			key, _ := kv.Key.(*ast.BasicLit)
			val, _ := kv.Value.(*ast.CompositeLit)
			if key == nil || val == nil {
				continue
			}
			from, _ := strconv.Unquote(key.Value)
			to := []string{}
			for _, x := range val.Elts {
				if s, ok := x.(*ast.BasicLit); ok {
					v, _ := strconv.Unquote(s.Value)
					to = append(to, v)
				}
			}
			rows[from] = to
		}
		return false
	})
	if len(rows) == 0 {
		t.Fatal("no mayImport table in ../layout_test.go: the architecture page's dependency table is checked against it (update TestArchitecturePage if it moved)")
	}
	return rows
}
