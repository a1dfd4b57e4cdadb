package node_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// metric reads the value of the series named exactly series (name and
// labels) from a /metrics page; ok is false when it is absent.
func metric(page, series string) (float64, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// stream starts a streamed completion at url and returns the response
// once its first token event arrived (or the error status and body).
func stream(t *testing.T, url, body string) (*http.Response, *bufio.Scanner, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tc.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		return nil, nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			return resp, sc, nil
		}
	}
	resp.Body.Close()
	return nil, nil, fmt.Errorf("the stream ended before a token")
}

// post429 posts body and returns the status, the Retry-After header and
// the body.
func post429(t *testing.T, url, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tc.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// finish reads a stream to its end and reports whether it ended with
// [DONE] after no error event.
func finish(resp *http.Response, sc *bufio.Scanner) bool {
	done, _ := finishCount(resp, sc)
	return done
}

// finishCount is finish, also counting the stream's data events (one per
// step that produced a token, and the final one).
func finishCount(resp *http.Response, sc *bufio.Scanner) (done bool, events int) {
	defer resp.Body.Close()
	for sc.Scan() {
		switch l := sc.Text(); {
		case strings.Contains(l, `"error"`):
			return false, events
		case l == "data: [DONE]":
			return true, events
		case strings.HasPrefix(l, "data: {"):
			events++
		}
	}
	return false, events
}

// TestPlannedAdmission: a model spread over two agents, loaded with
// --max-seqs 1 --queue 1, runs one sequence on its driver, queues the
// next, and answers a third request 429 with Retry-After; the driver's
// /metrics have the model's running, queued and KV series while it runs,
// and after both streams finished the KV blocks are free again, no replay
// happened, and both member nodes have step time histograms.
func TestPlannedAdmission(t *testing.T) {
	path := writeSpreadModel(t)
	c := tc.NewWith(t, 2, func(i int, cfg *node.Config) { cfg.MemoryLimit = 24 << 20 })
	tc.Eventually(t, 20*time.Second, "a leader", func() bool {
		s, err := c.Client(0, "").Status(ctx(t))
		return err == nil && s.Leader != "" && s.NodesAlive == 2
	})
	if _, err := c.Client(0, "").LoadModel(ctx(t), api.LoadModelRequest{Path: path, Ctx: 256, MaxSeqs: 1, Queue: 1, Overhead: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 30*time.Second, "the model ready", func() bool {
		mi := modelInfo(t, c, 0, "spread")
		return mi != nil && mi.Status == "ready"
	})
	p, err := c.Client(0, "").Placement(ctx(t), "spread")
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, p, 24<<20)
	if p.Context != 256 || p.Batch != 1 || p.Queue != 1 {
		t.Fatalf("plan context %d batch %d queue %d, want 256 x 1, queue 1", p.Context, p.Batch, p.Queue)
	}
	driver := -1
	for i, m := range c.Members {
		if m.Agent.ID() == p.Stages[0].Members[0].Node {
			driver = i
		}
	}
	base := "http://" + c.Members[driver].Agent.HTTPAddr()
	other := "http://" + c.Members[1-driver].Agent.HTTPAddr()
	scrape := func() string { return get(t, base+"/metrics") }
	series := func(name string) string { return fmt.Sprintf(`%s{model="spread"}`, name) }

	// The random model may end a stream early: then the scenario is tried
	// again with another seed.
	var page string
	ok := false
	firstEvents := 0 // the first stream's data events: at least one step each
	for try := 0; try < 5 && !ok; try++ {
		body := func(n int) string {
			return fmt.Sprintf(`{"model":"spread","prompt":"once upon a time","max_tokens":%d,"stream":true,"temperature":1,"seed":%d}`, n, try)
		}
		first, firstSc, err := stream(t, base+"/v1/completions", body(200))
		for end := time.Now().Add(10 * time.Second); err != nil && err.Error() == "status 503" && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond) // ready, the driver not serving yet
			first, firstSc, err = stream(t, base+"/v1/completions", body(200))
		}
		if err != nil {
			t.Fatalf("first request: %v", err)
		}
		type result struct {
			done bool
			err  error
		}
		second := make(chan result, 1)
		go func() {
			resp, sc, err := stream(t, base+"/v1/completions", body(5))
			if err != nil {
				second <- result{err: err}
				return
			}
			second <- result{done: finish(resp, sc)}
		}()
		queued := false
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !queued; time.Sleep(5 * time.Millisecond) {
			page = scrape()
			v, _ := metric(page, series("shoal_queue_depth"))
			queued = v == 1
		}
		if !queued {
			t.Fatalf("the second request never queued:\n%s", page)
		}
		// Direct and through the other agent (which forwards to the
		// driver). A 200 means there was room: the first stream ended.
		code, retry, third := post429(t, base+"/v1/completions", `{"model":"spread","prompt":"hi","max_tokens":2}`)
		fcode, fretry, fthird := post429(t, other+"/v1/completions", `{"model":"spread","prompt":"hi","max_tokens":2}`)
		running, _ := metric(page, series("shoal_running_sequences"))
		used, _ := metric(page, series("shoal_kv_blocks_used"))
		free, hasFree := metric(page, series("shoal_kv_blocks_free"))
		if code == http.StatusOK || fcode == http.StatusOK {
			t.Logf("try %d: the first stream ended before the third request (%d, forwarded %d); again", try, code, fcode)
			finish(first, firstSc)
			<-second
			continue
		}
		if code != http.StatusTooManyRequests || retry == "" {
			t.Fatalf("third request with 1 running and 1 queued: %d, Retry-After %q, %s", code, retry, third)
		}
		if fcode != http.StatusTooManyRequests || fretry == "" {
			t.Fatalf("third request through the other agent: %d, Retry-After %q, %s", fcode, fretry, fthird)
		}
		t.Logf("429 with Retry-After %s s (through the other agent: %s s): %s", retry, fretry, strings.TrimSpace(third))
		if running != 1 || used <= 0 || !hasFree || used+free != 256/16 {
			t.Errorf("while running: running %v, KV blocks used %v free %v", running, used, free)
		}
		var done bool
		if done, firstEvents = finishCount(first, firstSc); !done {
			t.Errorf("the first stream did not end with [DONE]")
		}
		if r := <-second; r.err != nil || !r.done {
			t.Errorf("the queued request: %+v", r)
		}
		ok = true
	}
	if !ok {
		t.Fatal("every try's first stream ended too early")
	}
	tc.Eventually(t, 10*time.Second, "the KV blocks free", func() bool {
		page = scrape()
		used, ok1 := metric(page, series("shoal_kv_blocks_used"))
		running, ok2 := metric(page, series("shoal_running_sequences"))
		return ok1 && ok2 && used == 0 && running == 0
	})
	if v, ok := metric(page, series("shoal_replays_total")); !ok || v != 0 {
		t.Errorf("shoal_replays_total %v %v", v, ok)
	}
	if _, ok := metric(page, series("shoal_replay_last_pause_seconds")); !ok {
		t.Errorf("no shoal_replay_last_pause_seconds")
	}
	for id := range planNodes(p) {
		name := id
		for _, m := range c.Members {
			if m.Agent.ID() == id {
				name = m.Cfg.Name
			}
		}
		count, ok := metric(page, fmt.Sprintf(`shoal_member_step_seconds_count{model="spread",node=%q}`, name))
		sum, _ := metric(page, fmt.Sprintf(`shoal_member_step_seconds_sum{model="spread",node=%q}`, name))
		// Every step of the first stream counts (its length is the random
		// model's: it may stop before max_tokens).
		if !ok || count < float64(firstEvents-1) || count < 10 || sum <= 0 || sum/count > 5 {
			t.Errorf("member %s: %v steps in %v s, the first stream streamed %d events", name, count, sum, firstEvents)
		}
	}
}
