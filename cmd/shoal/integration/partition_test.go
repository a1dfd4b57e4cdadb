//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPartitionHeals cuts one of three agents off (iptables in its own
// namespace drops everything on its link) for 20 s and then for 120 s,
// long after memberlist stopped gossiping with the members it holds dead.
// Within 30 s of healing, every agent's own gossip view (members) has the
// three alive and every agent's status is healthy with three nodes: the
// agents join their failed members again in the background (#35). A
// model spread over two agents (none has the memory for it alone) is
// served through the cut agent before each cut and again after each heal:
// a chat completion sent to it answers 200 with a finished choice (a 503 is retried
// after its Retry-After, as the OpenAI SDKs do, for up to a minute).
func TestPartitionHeals(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("integration: iptables is not installed")
	}
	e := setup(t, 4)
	agents := e.nodes[:3]
	// The fourth namespace is the clients' machine; no agent runs there.
	f := &faultEnv{env: e, box: e.nodes[3]}
	model := filepath.Join(e.dir, "spread.gguf")
	if out, err := runIn(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "256", "--n-layer", "8",
		"--n-head", "4", "--n-head-kv", "2", "--n-ff", "768", "--vocab-size", "512", "--ctx", "2048", "--seed", "5", "-q", "--out", model); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	for _, p := range agents {
		p.args = append(p.args, "--memory-limit", "12MiB", "--threads", "1")
		e.start(p)
	}
	e.waitHealthy(agents[0], 3, 60*time.Second)
	f.key = f.token(t, agents[0], "--kind", "inference", "--description", "partition requests")
	f.ca = filepath.Join(agents[0].dir, "tls", "https-ca.pem")
	var loaded map[string]any
	if err := e.cli(agents[0], &loaded, "model", "load", model, "--name", "spread", "--ctx", "700", "--max-seqs", "4", "--overhead", "1MiB",
		"--strategy", "pipeline", "--wait", "120s"); err != nil {
		t.Fatal(err)
	}
	cut := agents[2]
	f.chatThrough(t, cut, "before the partitions")
	f.refreshIDs(t, agents[0])
	names := map[string]string{}
	for name, id := range f.ids {
		names[id] = name
	}
	logPlan := func() {
		pl := f.waitServed(t, agents[0], time.Minute)
		var ms []string
		for _, m := range pl.members {
			ms = append(ms, names[m])
		}
		t.Logf("plan v%d: driver %s, members %v", pl.version, names[pl.driver], ms)
	}
	logPlan()
	veth := fmt.Sprintf("v%d", 2)
	rule := func(op string) error {
		for _, r := range [][]string{{"INPUT", "-i"}, {"OUTPUT", "-o"}} {
			if err := run(t, "ip", "netns", "exec", cut.ns, "iptables", op, r[0], r[1], veth, "-j", "DROP"); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range []time.Duration{20 * time.Second, 120 * time.Second} {
		if err := rule("-A"); err != nil {
			t.Skipf("integration: iptables cannot drop in a namespace: %v", err)
		}
		t0 := time.Now()
		split := func() bool { return e.aliveIn(e.nodes[0]) == 2 && e.aliveIn(cut) == 1 }
		for !split() {
			if time.Since(t0) > d {
				t.Fatalf("%v partition: the sides never saw each other failed", d)
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("partition of %v: both sides saw the other failed after %v", d, time.Since(t0).Round(100*time.Millisecond))
		time.Sleep(time.Until(t0.Add(d)))
		if err := rule("-D"); err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		for _, p := range agents {
			for {
				var s status
				if e.aliveIn(p) == 3 && e.cli(p, &s, "status") == nil && s.Health == "healthy" && s.NodesAlive == 3 {
					break
				}
				if time.Since(healed) > 30*time.Second {
					var ms []member
					_ = e.cli(p, &ms, "members")
					t.Fatalf("%v partition: %s has not converged 30 s after healing: members %+v, status %+v", d, p.name, ms, s)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
		t.Logf("MEASURED partition of %s for %v: every agent's members and status converged %v after healing",
			cut.name, d, time.Since(healed).Round(100*time.Millisecond))
		f.chatThrough(t, cut, fmt.Sprintf("%v after healing", time.Since(healed).Round(100*time.Millisecond)))
		t.Logf("MEASURED partition of %s for %v: a chat completion through it answered %v after healing",
			cut.name, d, time.Since(healed).Round(100*time.Millisecond))
		logPlan()
	}
}

// chatThrough sends a chat completion for the spread model to p's
// endpoint and fails the test unless it answers 200 with a finished
// choice within a minute. As the OpenAI SDKs do, it retries a 503 after
// its Retry-After and a request that failed to connect (an agent serves
// HTTPS once a server signed its certificate), each on a new connection:
// one the client kept across a cut was closed by the agent's idle timeout
// while the cut dropped the close, and is reset when used.
func (f *faultEnv) chatThrough(t *testing.T, p *proc, when string) {
	t.Helper()
	body := `{"model":"spread","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"temperature":0}`
	for end := time.Now().Add(time.Minute); ; {
		f.httpClient().CloseIdleConnections()
		resp, cancel, err := f.postRetrying(t, p.ip, body, time.Minute)
		if err != nil {
			if time.Now().After(end) {
				t.Fatalf("chat through %s %s: %v", p.name, when, err)
			}
			t.Logf("chat through %s %s: %v; retrying in 1 s", p.name, when, err)
			time.Sleep(time.Second)
			continue
		}
		var out struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || len(out.Choices) != 1 || out.Choices[0].FinishReason == "" {
			t.Fatalf("chat through %s %s: HTTP %d %s", p.name, when, resp.StatusCode, b)
		}
		return
	}
}

type member struct {
	Name   string `json:"name"`
	Status string `json:"status"`
}

// aliveIn is how many members p's own gossip view holds alive (-1 when
// it cannot be asked).
func (e *env) aliveIn(p *proc) int {
	var ms []member
	if err := e.cli(p, &ms, "members"); err != nil {
		return -1
	}
	n := 0
	for _, m := range ms {
		if strings.EqualFold(m.Status, "alive") {
			n++
		}
	}
	return n
}
