//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"shoal/hub/hubtest"
)

// TestUpCurl runs `shoal up` as a user would (what `make run` does), runs
// the curl line it prints, and checks that a completion comes back and that
// Ctrl-C stops every agent.
func TestUpCurl(t *testing.T) {
	dir, bin := buildForUp(t)
	upAndCurl(t, dir, bin, 3)
}

// TestUpFewerNodes: 'shoal up --nodes 1' on the data dir of a 3-node run
// (whose Raft configuration has three voters, two of which this run does
// not start) serves, instead of waiting for a leader that never comes;
// and a 3-node run after it serves again.
func TestUpFewerNodes(t *testing.T) {
	dir, bin := buildForUp(t)
	upAndCurl(t, dir, bin, 3)
	var log bytes.Buffer
	upAndCurlLog(t, dir, bin, 1, &log)
	if !strings.Contains(log.String(), "names voters this run does not start (node-2, node-3); node-1 start as its voters") {
		t.Errorf("shoal up did not say it made the started node the voter:\n%s", log.String())
	}
	log.Reset()
	upAndCurlLog(t, dir, bin, 3, &log)
	if !strings.Contains(log.String(), "differs among the nodes") {
		t.Errorf("shoal up did not say it made the nodes agree on the voters:\n%s", log.String())
	}
}

// TestUpFewLayers: `shoal up --model OWNER/REPO:QUANT` of a hub model
// with fewer layers than agents (its default strategy, pipeline, wants a
// stage per agent) pulls it, serves it on a plan that fits and says so in
// the banner, instead of exiting with "unservable", and names it by its
// store name (not its file's hash) in the banner, the curl line and
// /v1/models.
func TestUpFewLayers(t *testing.T) {
	dir, bin := buildForUp(t)
	model := filepath.Join(dir, "two.gguf")
	if out, err := exec.Command(bin, "gen-model", "--arch", "llama", "--n-layer", "2", "--n-embd", "128", "--n-head", "4",
		"--n-head-kv", "2", "--n-ff", "256", "--type", "q8_0", "-q", "--out", model).CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	body, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	hub := hubtest.New(t)
	hub.AddRepo("tester/TwoLayer-GGUF", map[string][]byte{"twolayer-q8_0.gguf": body})
	t.Setenv("HF_ENDPOINT", hub.URL)
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "")
	t.Setenv("SHOAL_MODELS", filepath.Join(dir, "store"))
	banner := upAndCurl(t, dir, bin, 3, "--model", "tester/TwoLayer-GGUF:Q8_0")
	note, named := "", false
	for _, l := range banner {
		s := strings.TrimSpace(l)
		if strings.HasPrefix(s, "note ") {
			note = s
		}
		named = named || strings.HasPrefix(s, "model ") && strings.Contains(s, "twolayer:q8_0")
		if strings.Contains(s, "sha256-") {
			t.Errorf("the banner names the model by its file: %q", s)
		}
	}
	if !named || !strings.Contains(note, "2 layers for 3 nodes") || !strings.Contains(note, "planned instead") {
		t.Errorf("the banner does not name the model by its store name or say why the plan differs from what was asked: %q", banner)
	}
}

// buildForUp builds the binary into a temporary folder.
func buildForUp(t *testing.T) (dir, bin string) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	dir = t.TempDir()
	bin = filepath.Join(dir, "shoal")
	build := exec.Command("go", "build", "-o", bin, "shoal/cmd/shoal")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return dir, bin
}

// upAndCurl runs `shoal up` with nodes agents (and args), runs the curl line it
// prints, checks the completion, stops it with Ctrl-C and checks that no
// agent is left; it returns the lines printed up to the banner's end.
func upAndCurl(t *testing.T, dir, bin string, nodes int, args ...string) []string {
	return upAndCurlLog(t, dir, bin, nodes, nil, args...)
}

// upAndCurlLog is upAndCurl that also copies what shoal up writes to
// stderr into log.
func upAndCurlLog(t *testing.T, dir, bin string, nodes int, log io.Writer, args ...string) []string {
	base := freeBase(t)
	cmd := exec.Command(bin, append([]string{"up", "--nodes", strconv.Itoa(nodes), "--data-dir", filepath.Join(dir, "up"), "--port", base}, args...)...)
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if log != nil {
		cmd.Stderr = io.MultiWriter(os.Stderr, log)
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Collect the printed lines up to "Ctrl-C stops the cluster."
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var curl, banner []string
	inCurl := false
	timeout := time.After(120 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("shoal up exited before it was ready")
			}
			banner = append(banner, l)
			s := strings.TrimSpace(l)
			if strings.HasPrefix(s, "curl ") {
				inCurl = true
			}
			if inCurl {
				curl = append(curl, strings.TrimSuffix(s, "\\"))
				if !strings.HasSuffix(s, "\\") {
					inCurl = false
				}
			}
			if strings.HasPrefix(s, "Ctrl-C stops the cluster") {
				break wait
			}
		case <-timeout:
			t.Fatal("shoal up was not ready within 120 s")
		}
	}
	t.Logf("shoal up ready in %v", time.Since(t0).Round(time.Millisecond))
	if len(curl) == 0 {
		t.Fatal("shoal up printed no curl line")
	}
	out, err := exec.Command("sh", "-c", strings.Join(curl, " ")+" --silent --show-error --fail").Output()
	if err != nil {
		for i := 1; i <= nodes; i++ {
			b, _ := os.ReadFile(filepath.Join(dir, "up", fmt.Sprintf("node-%d", i), "agent.log"))
			for _, crash := range []string{"\npanic: ", "\nfatal error: "} {
				if k := bytes.Index(b, []byte(crash)); k >= 0 {
					t.Logf("node-%d crashed:\n%s", i, b[k:min(len(b), k+4000)])
				}
			}
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("node-%d's log ends:\n%s", i, b)
		}
		t.Fatalf("the printed curl line failed: %v\n%s", err, out)
	}
	var resp struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("completion is not JSON: %v\n%s", err, out)
	}
	if len(resp.Choices) != 1 || resp.Usage.CompletionTokens == 0 || resp.Choices[0].FinishReason == "" {
		t.Fatalf("unexpected completion: %s", out)
	}
	// Ctrl-C: every agent stops and shoal up exits cleanly.
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shoal up exited with %v after Ctrl-C", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("shoal up did not stop within 30 s of Ctrl-C")
	}
	if out, _ := exec.Command("pgrep", "-f", filepath.Join(dir, "up")).Output(); len(out) > 0 {
		t.Fatalf("agents still running after shoal up stopped: %s", out)
	}
	return banner
}

// freeBase finds a base port whose 3 agents' ports are all free.
func freeBase(t *testing.T) string {
	for base := 20000; base < 60000; base += 100 {
		ok := true
		for i := 0; i < 30 && ok; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return strconv.Itoa(base)
		}
	}
	t.Fatal("no free ports")
	return ""
}
