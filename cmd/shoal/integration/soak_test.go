//go:build integration

package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSoak keeps 16 streams with long outputs running on a model spread
// over three agents, each in its own network namespace and its own CPU
// cgroup (a share of this machine's cores, all of it busy), for SHOAL_SOAK
// (e.g. 10m; `make soak`). It measures and prints: streams finished and
// how each ended (every one must end with [DONE] or an error event, and
// none may go 10 s without a byte), the longest silence, Raft elections
// and leader changes and memberlist suspicions during the run (from
// /metrics), each agent's RSS after warm-up and at the end, and the KV
// blocks in use once the streams are done.
func TestSoak(t *testing.T) {
	d, _ := time.ParseDuration(os.Getenv("SHOAL_SOAK"))
	if d <= 0 {
		t.Skip("the soak runs for minutes: make soak (SHOAL_SOAK=10m) runs it")
	}
	const cg = "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(cg, "cpu.cfs_quota_us")); err != nil {
		t.Skip("no cgroup v1 cpu controller")
	}
	e := setup(t, 4)
	servers, box := e.nodes[:3], e.nodes[3]
	f := &faultEnv{env: e, box: box}
	model := filepath.Join(e.dir, "soak.gguf")
	if out, err := runIn(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "256", "--n-layer", "8",
		"--n-head", "4", "--n-head-kv", "2", "--n-ff", "768", "--vocab-size", "512", "--ctx", "4096", "--seed", "9", "-q", "--out", model); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	// Each agent gets 0.6 of a core (the 3 of them and the clients keep
	// both cores of a 2-core machine busy) and one engine thread.
	var groups []string
	for i, p := range servers {
		g := filepath.Join(cg, fmt.Sprintf("shoal-soak-%d-%d", os.Getpid(), i))
		if err := os.Mkdir(g, 0o755); err != nil {
			t.Skipf("cgroup: %v", err)
		}
		groups = append(groups, g)
		// This cleanup runs before the environment's, which stops the
		// agents: a cgroup with a task cannot be removed, so the agent
		// goes first (the leftover groups of earlier soaks showed it).
		t.Cleanup(func() {
			if p.cmd != nil && p.cmd.Process != nil {
				_ = p.cmd.Process.Kill()
			}
			for range 50 {
				if os.Remove(g) == nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("cgroup %s not removed", g)
		})
		if err := os.WriteFile(filepath.Join(g, "cpu.cfs_quota_us"), []byte("60000"), 0o644); err != nil {
			t.Fatal(err)
		}
		p.args = append(p.args, "--memory-limit", "24MiB", "--threads", "1")
		e.start(p)
		if err := os.WriteFile(filepath.Join(g, "cgroup.procs"), []byte(strconv.Itoa(p.cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.waitHealthy(servers[0], 3, 60*time.Second)
	f.key = f.token(t, servers[0], "--kind", "inference", "--description", "soak")
	f.ca = filepath.Join(servers[0].dir, "tls", "https-ca.pem")
	if err := e.cli(servers[0], nil, "model", "load", model, "--name", "spread", "--ctx", "512", "--max-seqs", "16", "--overhead", "1MiB",
		"--strategy", "pipeline", "--wait", "180s"); err != nil {
		t.Fatal(err)
	}
	f.refreshIDs(t, servers[1])
	pl := f.waitServed(t, servers[1], 120*time.Second)
	host := f.entry(pl)
	t.Logf("soak: %v, 16 streams through %s, plan v%d over %d nodes", d, host, pl.version, 1+len(pl.members))

	events := func() map[string]map[string]int {
		out := map[string]map[string]int{}
		for _, p := range servers {
			out[p.name] = f.metrics(t, p, `shoal_control_events_total\{event="([^"]+)"\} (\d+)`)
		}
		return out
	}
	rss := func() map[string]int {
		out := map[string]int{}
		for _, p := range servers {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
			if m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b); m != nil {
				out[p.name], _ = strconv.Atoi(string(m[1]))
			}
		}
		return out
	}

	var (
		mu                         sync.Mutex
		finished, done, errEv, bad int
		longest                    time.Duration
		problems                   []string
		tokens                     atomic.Int64
	)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var before map[string]map[string]int
	var rssWarm map[string]int
	// Warm-up is the first fifth of the run: a 10-minute soak's agents
	// reach their steady heap within about 2 minutes (RSS per minute of
	// one run: 61.8, 64.1, 65.2, 65.9, 66.5, 66.5, 66.5, ... MB).
	warm := time.AfterFunc(d/5, func() {
		mu.Lock()
		defer mu.Unlock()
		before, rssWarm = events(), rss()
	})
	defer warm.Stop()
	// RSS every tenth of the run, to tell warm-up from growth.
	var samples []string
	sampler := time.NewTicker(d / 10)
	defer sampler.Stop()
	go func() {
		for range sampler.C {
			r := rss()
			mu.Lock()
			samples = append(samples, fmt.Sprint(r))
			mu.Unlock()
		}
	}()
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				body := fmt.Sprintf(`{"model":"spread","stream":true,"messages":[{"role":"user","content":"soak %d %d"}],"max_tokens":400,"temperature":0.8,"seed":%d}`, i, n, i*1000+n)
				req, _ := http.NewRequest("POST", "https://"+host+":7948/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+f.key)
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Minute)
				resp, err := f.httpClient().Do(req.WithContext(rctx))
				if err != nil {
					rcancel()
					mu.Lock()
					bad++
					problems = append(problems, fmt.Sprintf("stream %d.%d: %v", i, n, err))
					mu.Unlock()
					time.Sleep(time.Second)
					continue
				}
				rd := bufio.NewReader(resp.Body)
				last, silence, ended := time.Now(), time.Duration(0), ""
				for {
					line, err := rd.ReadString('\n')
					if gap := time.Since(last); gap > silence {
						silence = gap
					}
					last = time.Now()
					if err != nil {
						break
					}
					switch line = strings.TrimSpace(line); {
					case line == "data: [DONE]":
						ended = "done"
					case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"error"`):
						ended = "error: " + line
					case strings.HasPrefix(line, "data: "):
						tokens.Add(1)
					}
				}
				resp.Body.Close()
				rcancel()
				mu.Lock()
				finished++
				longest = max(longest, silence)
				switch {
				case ended == "done":
					done++
				case strings.HasPrefix(ended, "error"):
					errEv++
					problems = append(problems, fmt.Sprintf("stream %d.%d: %s", i, n, ended))
				default:
					bad++
					problems = append(problems, fmt.Sprintf("stream %d.%d (HTTP %d) ended with neither [DONE] nor an error event", i, n, resp.StatusCode))
				}
				if silence > 10*time.Second {
					bad++
					problems = append(problems, fmt.Sprintf("stream %d.%d was silent for %v", i, n, silence.Round(time.Millisecond)))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	after, rssEnd := events(), rss()
	time.Sleep(2 * time.Second)
	kv := map[string]map[string]int{}
	for _, p := range servers {
		kv[p.name] = f.metrics(t, p, `shoal_kv_blocks_used\{model="([^"]+)"\} (\d+)`)
	}
	for _, g := range groups {
		b, _ := os.ReadFile(filepath.Join(g, "cpu.stat"))
		t.Logf("%s cpu.stat: %s", filepath.Base(g), strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", ", "))
	}

	mu.Lock()
	defer mu.Unlock()
	t.Logf("MEASURED soak %v: %d streams finished (%d [DONE], %d error events, %d bad), %d tokens, longest silence %v",
		d, finished, done, errEv, bad, tokens.Load(), longest.Round(time.Millisecond))
	t.Logf("MEASURED RSS (kB) every %v: %s", d/10, strings.Join(samples, " "))
	for _, p := range problems[:min(len(problems), 20)] {
		t.Log(p)
	}
	for _, p := range servers {
		diff := func(k string) int { return after[p.name][k] - before[p.name][k] }
		growth := 0.0
		if rssWarm[p.name] > 0 {
			growth = 100 * float64(rssEnd[p.name]-rssWarm[p.name]) / float64(rssWarm[p.name])
		}
		t.Logf("MEASURED %s after warm-up: %d elections, %d leaderships won, %d suspicions, %d deaths, %d degraded probes; RSS %d -> %d kB (%+.1f%%); KV blocks used at the end %v",
			p.name, diff("raft.state.candidate"), diff("raft.state.leader"), diff("memberlist.msg.suspect"), diff("memberlist.msg.dead"),
			diff("memberlist.degraded.probe"), rssWarm[p.name], rssEnd[p.name], growth, kv[p.name])
		if os.Getenv("SOAK_STRICT") == "1" {
			if diff("raft.state.candidate") != 0 || diff("memberlist.msg.suspect") != 0 {
				t.Errorf("%s: the control plane did not hold", p.name)
			}
			if growth > 5 {
				t.Errorf("%s: RSS grew %.1f%% after warm-up", p.name, growth)
			}
		}
		for m, n := range kv[p.name] {
			if n != 0 {
				t.Errorf("%s: %d KV blocks of %s still used after every stream ended", p.name, n, m)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d streams ended badly or went silent", bad)
	}
}

// metrics reads the series of p's /metrics matching re (two groups: a
// label and a value).
func (f *faultEnv) metrics(t *testing.T, p *proc, re string) map[string]int {
	req, _ := http.NewRequest("GET", "https://"+p.ip+":7948/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+secret) // /metrics takes a read or admin key
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]int{}
	resp, err := f.httpClient().Do(req.WithContext(ctx))
	if err != nil {
		t.Logf("metrics of %s: %v", p.name, err)
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	rx := regexp.MustCompile(re)
	for sc.Scan() {
		if m := rx.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]], _ = strconv.Atoi(m[2])
		}
	}
	return out
}
