//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notifySocket stands in for systemd's notification socket: it collects
// what an agent started with NOTIFY_SOCKET sends.
type notifySocket struct {
	path string
	msgs chan string
}

func newNotifySocket(t *testing.T, dir string) *notifySocket {
	t.Helper()
	path := filepath.Join(dir, "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	n := &notifySocket{path: path, msgs: make(chan string, 64)}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	return n
}

// wait returns the first message holding want, or fails after timeout.
func (n *notifySocket) wait(t *testing.T, want string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-n.msgs:
			if strings.Contains(m, want) {
				return m
			}
		case <-deadline:
			t.Fatalf("no %s from the agent within %v", want, timeout)
		}
	}
}

// TestServiceLifecycle runs agents as systemd would (Type=notify, a fake
// NOTIFY_SOCKET): READY=1 comes only once the agent has joined, a leader
// is known and it serves (a server waiting for a second bootstrap server
// sends nothing), and SIGTERM drains: STOPPING=1, new client requests get
// 503 while a stream in flight runs to [DONE], then the agent leaves and
// exits 0.
func TestServiceLifecycle(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "shoal")
	build := exec.Command("go", "build", "-o", bin, "shoal/cmd/shoal")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	model := filepath.Join(dir, "model.gguf")
	// Big enough that a stream of 400 tokens takes a few seconds.
	if out, err := exec.Command(bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-layer", "8", "--n-embd", "768", "--n-ff", "2048",
		"--out", model).CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	base, _ := strconv.Atoi(freeBase(t))
	secret := "service-lifecycle-secret-0123456789"
	quic := func(i int) string { return "127.0.0.1:" + strconv.Itoa(base+10*i+1) }
	type agent struct {
		cmd    *exec.Cmd
		notify *notifySocket
		api    string
		log    *bytes.Buffer
		exited chan error
	}
	start := func(i int, extra ...string) *agent {
		d := filepath.Join(dir, "n"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		a := &agent{notify: newNotifySocket(t, d), api: "http://127.0.0.1:" + strconv.Itoa(base+10*i+2), log: &bytes.Buffer{},
			exited: make(chan error, 1)}
		args := []string{"agent", "--server", "--bootstrap-expect", "2", "--name", "n" + strconv.Itoa(i), "--data-dir", d,
			"--bind", "127.0.0.1", "--gossip-port", strconv.Itoa(base + 10*i), "--quic-port", strconv.Itoa(base + 10*i + 1),
			"--http-port", strconv.Itoa(base + 10*i + 2), "--token", secret, "--join", quic(1 - i), "--drain-timeout", "60s"}
		a.cmd = exec.Command(bin, append(args, extra...)...)
		// WatchdogSec=2: the agent pings every second once ready. The
		// serving agent finds no Vulkan loader (--device auto): it says
		// why in one line and serves from the CPU.
		a.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+a.notify.path, "WATCHDOG_USEC=2000000")
		if i == 0 {
			a.cmd.Env = append(a.cmd.Env, "SHOAL_VULKAN_LIB=/nonexistent/libvulkan.so.1")
		}
		a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
		if err := a.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { a.exited <- a.cmd.Wait() }()
		t.Cleanup(func() {
			_ = a.cmd.Process.Kill()
			if t.Failed() {
				t.Logf("agent n%d log:\n%s", i, tail(a.log.String(), 4000))
			}
		})
		return a
	}
	ready := func(a *agent) int {
		resp, err := http.Get(a.api + "/v1/health?ready=1")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	n0 := start(0, "--model", model)
	// Alone, a server of a two-server bootstrap has no leader: not ready.
	select {
	case m := <-n0.notify.msgs:
		t.Fatalf("the agent told systemd %q before a second server joined", m)
	case <-time.After(4 * time.Second):
	}
	if code := ready(n0); code == http.StatusOK { // 503, or no API yet while it waits for its peer
		t.Fatal("readiness alone: 200, want not ready")
	}
	n1 := start(1)
	for _, a := range []*agent{n0, n1} {
		a.notify.wait(t, "READY=1", 60*time.Second)
		if code := ready(a); code != http.StatusOK {
			t.Fatalf("READY=1 sent while /v1/health?ready=1 answers %d", code)
		}
	}
	n1.notify.wait(t, "WATCHDOG=1", 5*time.Second)

	// A stream in flight on n0, which drives the model, when n0 gets SIGTERM.
	chat := func(a *agent, maxTokens int, stream bool) (*http.Response, error) {
		body := `{"model":"model","max_tokens":` + strconv.Itoa(maxTokens) + `,"stream":` + strconv.FormatBool(stream) +
			`,"messages":[{"role":"user","content":"hello"}]}`
		req, _ := http.NewRequest(http.MethodPost, a.api+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := chat(n0, 1, false)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the model is not served: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	resp, err := chat(n0, 400, true)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for events < 3 && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if err := n0.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	n0.notify.wait(t, "STOPPING=1", 10*time.Second)
	if code := ready(n0); code != http.StatusServiceUnavailable {
		t.Fatalf("readiness while draining: %d, want 503", code)
	}
	refused, err := chat(n0, 4, false)
	if err != nil {
		t.Fatalf("a request while draining: %v (want 503)", err)
	}
	refused.Body.Close()
	if refused.StatusCode != http.StatusServiceUnavailable || refused.Header.Get("Retry-After") == "" {
		t.Fatalf("a new request while draining: %d Retry-After %q, want 503 with Retry-After", refused.StatusCode, refused.Header.Get("Retry-After"))
	}
	done := false
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			done = true
		}
		if strings.Contains(sc.Text(), `"error"`) {
			t.Fatalf("the stream in flight ended with an error: %s", sc.Text())
		}
	}
	if !done {
		t.Fatalf("the stream in flight did not end with [DONE] (%v)", sc.Err())
	}
	select {
	case err := <-n0.exited:
		t.Fatalf("the agent had exited (%v) before the stream in flight ended", err)
	default:
	}
	select {
	case err := <-n0.exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("the drained agent exited %d, want 0", ee.ExitCode())
		} else if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit after draining")
	}
	if !strings.Contains(n0.log.String(), "left the cluster") {
		t.Fatalf("no leave in the drained agent's output:\n%s", tail(n0.log.String(), 2000))
	}
	if !regexp.MustCompile(`(?m)^device: cpu \(no Vulkan: no Vulkan loader \(libvulkan\) found: [^\n]*\)$`).MatchString(n0.log.String()) {
		t.Fatalf("the agent without a Vulkan loader did not say in one line that it runs on the CPU and why:\n%s", tail(n0.log.String(), 2000))
	}
}
