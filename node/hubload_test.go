package node_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/coordinator"
	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/synth"
	"shoal/hub"
	"shoal/hub/hubtest"
	"shoal/node"
	"shoal/node/fingerprint"
	"shoal/node/identity"
	tc "shoal/node/nodetest"
	"shoal/placement"
	"shoal/shard"
)

// completion asks agent base for a greedy completion of model.
func completion(t *testing.T, base, model string) (int, string) {
	t.Helper()
	code, body := post(t, base+"/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"the hub","max_tokens":8,"temperature":0}`, model))
	if code != 200 {
		return code, body
	}
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("completion of %s: %s", model, body)
	}
	return code, out.Choices[0].Text
}

// Must-show (issue #25): a 3-node cluster loads a model by hub reference
// from the fake hub. The loading agent reads the GGUF header (Range
// requests) and the model is planned at once; every node reads only its
// shards' ranges from the hub, holding them unrun until the loading agent
// has read the file back from the nodes, checked its sha256 against the
// hub's LFS sha256 and recorded the manifest; then each node checks its
// units and serves. Per node, the hub bytes equal the manifest units its
// shards' ranges touch (header included), give or take the units another
// node's shard also holds (which it may read over the LAN instead); the
// check reads nothing from the hub. The model serves the same greedy
// completion as the file loaded locally; a byte the hub corrupts fails the
// load with both hashes and the model never serves.
func TestLoadModelFromHub(t *testing.T) {
	path := enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 6, NHead: 4, NHeadKV: 2, NFF: 512, Type: "q8_0", Seed: 7, Name: "hubby"})
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const repo, fname = "org/hubby-GGUF", "hubby-q8_0.gguf"
	hs := hubtest.New(t)
	hs.AddRepo(repo, map[string][]byte{fname: file, "README.md": []byte("# hubby")})
	// Another file (one the cluster has not verified yet) with a byte the
	// hub corrupts.
	bad, err := os.ReadFile(enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 6, NHead: 4, NHeadKV: 2, NFF: 512, Type: "q8_0", Seed: 8, Name: "bad"}))
	if err != nil {
		t.Fatal(err)
	}
	hs.AddRepo("org/bad-GGUF", map[string][]byte{fname: bad})
	hs.Corrupt("org/bad-GGUF", fname, int64(len(bad))/2)
	// The first range read of the file (the header) is cut once after
	// 10 KB: it resumes.
	hs.CutOnce(repo, fname, 10_000)

	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		cfg.Hub = &hub.Client{Endpoint: hs.URL, Backoff: 20 * time.Millisecond}
	})
	waitHealthy(t, c, 0, 3, 3, 20*time.Second)
	var names []string
	for _, m := range c.Members {
		names = append(names, m.Cfg.Name)
	}
	cl := c.Client(0, tc.Secret)
	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Hub: repo + ":Q8_0", Name: "hubby", Nodes: names, Strategy: "pipeline", Ctx: 256, Wire: "f32"}); err != nil {
		t.Fatal(err)
	}
	info := waitModelReady(t, c, "hubby")
	if info.Digest != hubtest.SHA256(file) {
		t.Errorf("digest %s, want the file's %s", info.Digest, hubtest.SHA256(file))
	}

	// What each node should read: the manifest units its shards touch.
	st := c.Members[0].Agent.Server().FSM().State()
	plan := st.Plans["hubby"]
	gf, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	table, err := shard.TableOf(gf)
	gf.Close()
	if err != nil {
		t.Fatal(err)
	}
	units := shard.Units(table, shard.DefaultUnitSize)
	touched := map[string]map[int]bool{} // node ID → unit indexes
	ranges := map[string]int64{}         // node ID → bytes of its shards' ranges
	pieces := map[string]int{}           // node ID → pieces of its shards' layouts
	for _, m := range c.Members {
		touched[m.Agent.ID()] = map[int]bool{}
		for _, spec := range shard.SpecsFor(*plan, m.Agent.ID(), info.Digest) {
			l, err := shard.NewLayout(table, spec, 0)
			if err != nil {
				t.Fatal(err)
			}
			pieces[m.Agent.ID()] += len(l.Pieces)
			for _, r := range l.Ranges() {
				ranges[m.Agent.ID()] += r.N
				for k, u := range units {
					if u.Off < r.End() && r.Off < u.End() {
						touched[m.Agent.ID()][k] = true
					}
				}
			}
		}
	}
	served := map[string]int64{} // User-Agent → body bytes
	var cut []string             // the Range a resumed read asks for
	reqs := map[string]int{}     // User-Agent → range requests answered
	for _, r := range hs.Requests() {
		if r.Repo != repo || r.Path != fname {
			continue
		}
		served[r.UserAgent] += r.Bytes
		if r.Status == http.StatusPartialContent {
			reqs[r.UserAgent]++
		}
		var from int64
		if _, err := fmt.Sscanf(r.Range, "bytes=%d-", &from); err == nil && r.Bytes == 10_000 {
			cut = append(cut, fmt.Sprintf("bytes=%d-", from+10_000))
		}
	}
	resumed := false
	for _, r := range hs.Requests() {
		for _, c := range cut {
			resumed = resumed || strings.HasPrefix(r.Range, c)
		}
	}
	if !resumed {
		t.Errorf("the cut range read was not resumed 10000 bytes on: %+v", hs.Requests())
	}
	size := int64(len(file))
	t.Logf("file %d bytes, header %d bytes, %d units", size, table.DataOffset, len(units))
	t.Logf("%-10s %-8s %12s %12s %12s %12s %12s %12s %9s %7s", "node", "layers", "hub bytes", "ranges", "units", "own units", "header read", "check", "requests", "pieces")
	var total int64
	for _, m := range c.Members {
		id := m.Agent.ID()
		var want, own int64
		for k := range touched[id] {
			want += units[k].N
			shared := false
			for _, o := range c.Members {
				if o.Agent.ID() != id && touched[o.Agent.ID()][k] {
					shared = true
				}
			}
			if !shared {
				own += units[k].N
			}
		}
		lohi := ""
		for _, spec := range shard.SpecsFor(*plan, id, info.Digest) {
			lohi += fmt.Sprintf("[%d,%d)", spec.Lo, spec.Hi)
		}
		got := served["shoal/"+m.Cfg.Name]
		header := served["shoal/"+m.Cfg.Name+" header"]
		verify := served["shoal/"+m.Cfg.Name+" verify"]
		total += got + header + verify
		t.Logf("%-10s %-8s %12d %12d %12d %12d %12d %12d %9d %7d", m.Cfg.Name, lohi, got, ranges[id], want, own, header, verify, reqs["shoal/"+m.Cfg.Name], pieces[id])
		if reqs["shoal/"+m.Cfg.Name] > pieces[id]+2 { // a resumed cut adds one
			t.Errorf("node %s sent %d range requests for %d pieces: adjacent ranges go in one request", m.Cfg.Name, reqs["shoal/"+m.Cfg.Name], pieces[id])
		}
		if got < own || got > want {
			for _, r := range hs.Requests() {
				if r.UserAgent == "shoal/"+m.Cfg.Name {
					t.Logf("  %s %d", r.Range, r.Bytes)
				}
			}
			t.Errorf("node %s read %d bytes from the hub; its shards' units are %d bytes (%d only its own)", m.Cfg.Name, got, want, own)
		}
		if verify != 0 {
			t.Errorf("node %s read %d bytes from the hub to check the file (it is read back from the nodes)", m.Cfg.Name, verify)
		}
		if m.Agent.ID() == c.Members[0].Agent.ID() {
			if header < int64(table.DataOffset) || header > 2*int64(table.DataOffset)+64<<10 {
				t.Errorf("the loading agent read %d bytes for a %d-byte header", header, table.DataOffset)
			}
		} else if header != 0 {
			t.Errorf("node %s read %d bytes of header", m.Cfg.Name, header)
		}
	}
	t.Logf("read from the hub: %d bytes = %.3f x the file (shards, header and check)", total, float64(total)/float64(size))
	if float64(total) >= 1.2*float64(size) {
		t.Errorf("the nodes read %d bytes from the hub for a %d-byte file", total, size)
	}

	// The same file loaded from a local path serves the same greedy text.
	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: path, Name: "local", Nodes: names[:1], Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 60*time.Second, "the local model ready", func() bool {
		i := modelInfo(t, c, 0, "local")
		return i != nil && i.Status == "ready"
	})
	// Another agent's view of the plans may trail the one that said
	// ready by a moment (its Raft log applies later; the driver starts
	// after ready): it answers 503 with Retry-After until then.
	base := "http://" + c.Members[1].Agent.HTTPAddr()
	var code, code2 int
	var fromHub, fromFile string
	tc.Eventually(t, 30*time.Second, "both models answer on another agent", func() bool {
		code, fromHub = completion(t, base, "hubby")
		code2, fromFile = completion(t, base, "local")
		return code == 200 && code2 == 200
	})
	if fromHub != fromFile || fromHub == "" {
		t.Errorf("hub model: %d %q; local file: %d %q", code, fromHub, code2, fromFile)
	}
	t.Logf("greedy completion: %q (both)", fromHub)
	toks := []int32{1, 7, 42, 3, 99}
	lh, err := cl.ClusterLogits(ctx(t), "hubby", toks)
	if err != nil {
		t.Fatal(err)
	}
	lf, err := cl.ClusterLogits(ctx(t), "local", toks)
	if err != nil {
		t.Fatal(err)
	}
	if lh.NTokens != lf.NTokens || lh.NVocab != lf.NVocab || len(lh.Data) != len(lf.Data) {
		t.Fatalf("logits shapes %dx%d and %dx%d", lh.NTokens, lh.NVocab, lf.NTokens, lf.NVocab)
	}
	for i := range lh.Data {
		if lh.Data[i] != lf.Data[i] {
			t.Fatalf("logit %d: %v from the hub's 3-node plan, %v from the local file", i, lh.Data[i], lf.Data[i])
		}
	}
	t.Logf("logits of %d tokens x %d: bit for bit the local file's (wire f32)", lh.NTokens, lh.NVocab)

	// Tensor parallel: each member holds half of every row of the
	// column-split matrices (attn_output, ffn_down), so the check reads each
	// row from two nodes, and each node checks its units with its peer's
	// halves over the LAN. From the hub a member reads those rows whole
	// (halves at most hubBridge apart go in one Range request): a request
	// per half row would be hundreds of thousands of round trips for a
	// large model. Here those matrices are a large part of the file.
	tpPath := enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 4, NHead: 4, NHeadKV: 2, NFF: 512, Type: "q8_0", Seed: 10, Name: "tp"})
	tpFile, err := os.ReadFile(tpPath)
	if err != nil {
		t.Fatal(err)
	}
	hs.AddRepo("org/tp-GGUF", map[string][]byte{fname: tpFile})
	for _, lr := range []api.LoadModelRequest{
		{Hub: "org/tp-GGUF:Q8_0", Name: "tp", Nodes: names[1:], Strategy: "tensor", Ctx: 256, Wire: "f32"},
		{Path: tpPath, Name: "tplocal", Nodes: names[:1], Ctx: 256},
	} {
		if _, err := cl.LoadModel(ctx(t), lr); err != nil {
			t.Fatal(err)
		}
		waitModelReady(t, c, lr.Name)
	}
	if p := c.Members[0].Agent.Server().FSM().State().Plans["tp"]; p == nil || len(p.Pools) != 1 || len(p.Pools[0].Stages) != 1 || len(p.Pools[0].Stages[0].Members) != 2 {
		t.Fatalf("the hub model is not on one tensor-parallel group of 2: %+v", p)
	}
	tpServed := hs.BytesServed("org/tp-GGUF", fname)
	tpReqs := 0
	for _, r := range hs.Requests() {
		if r.Repo == "org/tp-GGUF" && r.Status == http.StatusPartialContent {
			tpReqs++
		}
	}
	t.Logf("tensor parallel over 2 nodes: read from the hub %d bytes = %.3f x the file, %d range requests", tpServed, float64(tpServed)/float64(len(tpFile)), tpReqs)
	if float64(tpServed) >= 1.45*float64(len(tpFile)) || tpReqs > 100 {
		t.Errorf("the tensor-parallel load read %d bytes from the hub for a %d-byte file in %d requests", tpServed, len(tpFile), tpReqs)
	}
	// ready in the model list can come a moment before the driver's
	// node has started it ("not served yet"): the first request retries
	var lt, ll *api.Logits
	tc.Eventually(t, 30*time.Second, "tp and tplocal serving", func() bool {
		if lt == nil {
			lt, _ = cl.ClusterLogits(ctx(t), "tp", toks)
		}
		if ll == nil {
			ll, _ = cl.ClusterLogits(ctx(t), "tplocal", toks)
		}
		return lt != nil && ll != nil
	})
	worst := 0.0
	for i := range ll.Data {
		worst = max(worst, math.Abs(float64(lt.Data[i]-ll.Data[i])))
	}
	if len(lt.Data) != len(ll.Data) || worst > 1e-3 {
		t.Errorf("tensor-parallel logits from the hub differ from the local file's by up to %g", worst)
	}
	t.Logf("tensor-parallel logits from the hub vs the local file: max|Δ| %.2g", worst)

	// A corrupt byte: the load fails with both hashes, nothing serves.
	before := hs.BytesServed("org/bad-GGUF", fname)
	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Hub: "org/bad-GGUF/" + fname, Name: "bad", Nodes: names, Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 30*time.Second, "the corrupt model failed", func() bool {
		info = modelInfo(t, c, 0, "bad")
		if info != nil && info.Status == "ready" {
			t.Fatalf("the corrupt model is ready")
		}
		return info != nil && info.Status == coordinator.ModelFailed
	})
	if !strings.Contains(info.Reason, "sha256 mismatch") || !strings.Contains(info.Reason, hubtest.SHA256(bad)) || !strings.Contains(info.Reason, fname) {
		t.Errorf("reason %q", info.Reason)
	}
	t.Logf("corrupt byte: %s", info.Reason)
	tc.Eventually(t, 30*time.Second, "the corrupt model's plan released", func() bool {
		p := c.Members[0].Agent.Server().FSM().State().Plans["bad"]
		return p == nil || len(p.Pools) == 0
	})
	if code, body := completion(t, base, "bad"); code == 200 {
		t.Errorf("the corrupt model served: %s", body)
	}
	// The nodes' ranges, then the whole file once more to tell a node's
	// bad copy from a bad hub file.
	if got := hs.BytesServed("org/bad-GGUF", fname) - before; got < int64(len(bad)) || got > int64(len(bad))*23/10 {
		t.Errorf("the corrupt file: %d bytes read from the hub, want the nodes' ranges and one whole read of %d", got, len(bad))
	}

	// A byte the hub corrupts only for the nodes' range reads, after the
	// verification pass read it intact: the node's unit check catches it,
	// reads the unit again (still corrupt), fails the shard; nothing serves.
	late, err := os.ReadFile(enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 6, NHead: 4, NHeadKV: 2, NFF: 512, Type: "q8_0", Seed: 9, Name: "late"}))
	if err != nil {
		t.Fatal(err)
	}
	hs.AddRepo("org/late-GGUF", map[string][]byte{fname: late})
	hs.CorruptWhen("org/late-GGUF", fname, int64(len(late))/2, func(r *http.Request) bool {
		return !strings.HasSuffix(r.Header.Get("User-Agent"), " verify")
	})
	if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Hub: "org/late-GGUF:Q8_0", Name: "late", Nodes: names, Strategy: "pipeline", Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 60*time.Second, "a shard of the late-corrupted model failed", func() bool {
		info = modelInfo(t, c, 0, "late")
		if info != nil && info.Status == "ready" {
			t.Fatalf("the late-corrupted model is ready")
		}
		return info != nil && info.Status == "degraded"
	})
	if info.Digest != hubtest.SHA256(late) || !strings.Contains(info.Reason, "sha256 mismatch") {
		t.Errorf("late corruption: digest %s, reason %q", info.Digest, info.Reason)
	}
	t.Logf("late corrupt byte: %s", info.Reason)
	if code, body := completion(t, base, "late"); code == 200 {
		t.Errorf("the late-corrupted model served: %s", body)
	}
}

// The loading agent dies while its hub model's nodes fetch their ranges:
// restarted, it resumes the model's check (from the unverified manifest it
// kept) and the model serves; nothing is read twice from the hub.
func TestHubCheckResumesAfterRestart(t *testing.T) {
	c, hs, file, repo, fname := hubLoadOnTwo(t, "resume", 11)
	loader := c.Members[0].Agent.ID()
	hs.Delay(30 * time.Millisecond) // the nodes' range reads take a while
	c.Stop(0, false)
	var before *api.ModelInfo
	tc.Eventually(t, 20*time.Second, "the model's status (an election may run)", func() bool {
		before = modelInfo(t, c, 1, "resume")
		return before != nil
	})
	if before.Status == "ready" {
		t.Fatalf("the model is ready before its check: %+v", before)
	}
	if m := c.Members[1].Agent.Server().FSM().State().Models["resume"]; m == nil || !m.Unverified {
		t.Skip("the check finished before the loading agent stopped: nothing to resume (a fast host)")
	}
	time.Sleep(time.Second)
	c.Restart(0)
	hs.Delay(0)
	tc.Eventually(t, 90*time.Second, "the model ready after its loader restarted", func() bool {
		i := modelInfo(t, c, 1, "resume")
		if i != nil && i.Status == "failed" { // degraded while the loader is down: its manifest is out of reach, the shards retry
			t.Fatalf("%s: %s", i.Status, i.Reason)
		}
		return i != nil && i.Status == "ready"
	})
	tc.Eventually(t, 30*time.Second, "a completion (the driver starts a moment after ready)", func() bool {
		code, _ := completion(t, "http://"+c.Members[1].Agent.HTTPAddr(), "resume")
		return code == 200
	})
	var verify int64
	for _, r := range hs.Requests() {
		if strings.HasSuffix(r.UserAgent, " verify") {
			verify += r.Bytes
		}
	}
	served := hs.BytesServed(repo, fname)
	st := c.Members[1].Agent.Server().FSM().State()
	// The leader takes the check over only from a loader gone 10 s: a
	// restart that slow on a loaded host is logged, not failed.
	t.Logf("checked by %s (the loader: %v); plan v%d", st.Models["resume"].SourceNode, st.Models["resume"].SourceNode == loader, st.Plans["resume"].Version)
	t.Logf("read from the hub: %d bytes = %.3f x the file (%d to check)", served, float64(served)/float64(len(file)), verify)
	if verify != 0 || float64(served) >= 1.2*float64(len(file)) {
		t.Errorf("read %d bytes from the hub (%d to check) for a %d-byte file", served, verify, len(file))
	}
}

// The loading agent dies for good while its hub model's nodes fetch: once
// it is marked failed, the leader takes the check over (re-reading the
// header) and the model serves.
func TestHubCheckTakenOverWhenLoaderDies(t *testing.T) {
	c, hs, file, repo, fname := hubLoadOnTwo(t, "orphan", 12)
	loader := c.Members[0].Agent.ID()
	hs.Delay(30 * time.Millisecond)
	c.Stop(0, false)
	hs.Delay(0)
	tc.Eventually(t, 90*time.Second, "the model ready after its loader died", func() bool {
		i := modelInfo(t, c, 1, "orphan")
		if i != nil && i.Status == "failed" {
			t.Fatalf("%s: %s", i.Status, i.Reason)
		}
		return i != nil && i.Status == "ready"
	})
	m := c.Members[1].Agent.Server().FSM().State().Models["orphan"]
	if m == nil || m.SourceNode == loader || m.Unverified {
		t.Fatalf("the model after the take-over: %+v", m)
	}
	tc.Eventually(t, 30*time.Second, "a completion", func() bool {
		code, _ := completion(t, "http://"+c.Members[1].Agent.HTTPAddr(), "orphan")
		return code == 200
	})
	served := hs.BytesServed(repo, fname)
	t.Logf("read from the hub: %d bytes = %.3f x the file", served, float64(served)/float64(len(file)))
	if float64(served) >= 1.2*float64(len(file)) {
		t.Errorf("read %d bytes from the hub for a %d-byte file", served, len(file))
	}
}

// TestHubPlanKeptWhileLoading: a model loaded before the link between its
// nodes is measured is planned on the default link (1 Gbit/s, 1 ms). Its
// two nodes here differ 4x in speed, so a fast loopback link, once
// measured, makes another layer split over 25% faster. While the nodes
// still fetch their ranges from the hub the plan stays: moving it threw
// what they had fetched away and read it from the hub again (2.04x the
// file in a CI run of TestHubCheckResumesAfterRestart). Once loaded it is
// weighed on the link and moves, the moved layers read from the nodes: the
// hub serves the file about once.
func TestHubPlanKeptWhileLoading(t *testing.T) {
	const name = "kept"
	hs, file, repo, fname := hubRepo(t, name, 13)
	var ids, dirs [3]string
	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		cfg.Hub = &hub.Client{Endpoint: hs.URL, Backoff: 20 * time.Millisecond}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		var err error
		if ids[i], err = identity.LoadNodeID(cfg.DataDir); err != nil {
			t.Fatal(err)
		}
		dirs[i] = cfg.DataDir
		if i < 2 {
			return
		}
		// Of the two nodes the model runs on, the first by ID (the
		// pipeline's first stage) is the slow one.
		slow, fast := 1, 2
		if ids[2] < ids[1] {
			slow, fast = 2, 1
		}
		for _, n := range []struct {
			i            int
			gflops, gbps float64
		}{{0, 20, 5}, {slow, 10, 3}, {fast, 40, 10}} {
			if err := fingerprint.Record(dirs[n.i], "test", n.gflops, n.gbps); err != nil {
				t.Fatal(err)
			}
		}
	})
	waitHealthy(t, c, 0, 3, 3, 20*time.Second)
	// The nodes' range reads wait (the header is read at load).
	release := hs.Hold(func(r *http.Request) bool { return !strings.HasSuffix(r.Header.Get("User-Agent"), " header") })
	defer release()
	if _, err := c.Client(0, tc.Secret).LoadModel(ctx(t), api.LoadModelRequest{Hub: repo + ":Q8_0", Name: name,
		Nodes: []string{c.Members[1].Cfg.Name, c.Members[2].Cfg.Name}, Strategy: "pipeline", Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	state := func() *coordinator.State { return c.Members[1].Agent.Server().FSM().State() }
	var v1 *placement.Plan
	tc.Eventually(t, 30*time.Second, "the first plan", func() bool {
		v1 = state().Plans[name]
		return v1 != nil && len(v1.Pools) > 0
	})
	tc.Eventually(t, 60*time.Second, "the link between the plan's nodes measured", func() bool {
		st := state()
		return st.Links[ids[1]+">"+ids[2]] != nil && st.Links[ids[2]+">"+ids[1]] != nil
	})
	// What the nodes measured depends on the host (under -race a loopback
	// link can read as slow as the default); the link is then reported
	// as an idle loopback reads, on which the plan is clearly beaten.
	at := time.Now().UTC()
	fast := []coordinator.LinkStat{{From: ids[1], To: ids[2], Gbit: 10, LatencyMs: 0.05, MeasuredAt: at},
		{From: ids[2], To: ids[1], Gbit: 10, LatencyMs: 0.05, MeasuredAt: at}}
	tc.Eventually(t, 30*time.Second, "the fast link recorded", func() bool {
		srv := c.Members[c.Leader(10*time.Second)].Agent.Server()
		return srv.Apply(coordinator.LinkReportType, coordinator.LinkReportRequest{Links: fast}, 5*time.Second) == nil
	})
	time.Sleep(2 * time.Second) // the leader's planning passes
	if p := state().Plans[name]; p.Version != v1.Version {
		t.Fatalf("the plan moved while its nodes fetched it: v%d -> v%d: %v", v1.Version, p.Version, p.Moved)
	}
	release()
	waitModelReady(t, c, name)
	// Loaded, it is weighed on that link and moves; unless a node reported
	// the link again meanwhile (a transfer 4x faster or slower than the
	// estimate), which the plan is then weighed on instead.
	var moved *placement.Plan
	deadline := time.Now().Add(60 * time.Second)
	for {
		moved = state().Plans[name]
		i := modelInfo(t, c, 1, name)
		if moved.Version > v1.Version && i != nil && i.Status == "ready" && i.PlanVersion == moved.Version {
			t.Logf("once loaded: v%d -> v%d: %v", v1.Version, moved.Version, moved.Moved)
			break
		}
		if time.Now().After(deadline) {
			l := state().Links[ids[1]+">"+ids[2]]
			if moved.Version == v1.Version && l != nil && l.MeasuredAt.Equal(at) {
				t.Fatalf("not weighed again once loaded: still v%d on the fast link", v1.Version)
			}
			t.Logf("the link was reported again (%+v): plan v%d, status %+v", l, moved.Version, i)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	served := hs.BytesServed(repo, fname)
	t.Logf("read from the hub: %d bytes = %.3f x the file", served, float64(served)/float64(len(file)))
	if float64(served) >= 1.2*float64(len(file)) {
		t.Errorf("read %d bytes from the hub for a %d-byte file", served, len(file))
	}
}

// hubLoadOnTwo starts 3 agents on a fake hub holding a small random model
// (repo org/NAME-GGUF) and has agent 0 load it by hub reference onto
// agents 1 and 2 (pipeline): agent 0 loads it, the others hold it.
func hubLoadOnTwo(t *testing.T, name string, seed uint64) (*tc.Cluster, *hubtest.Server, []byte, string, string) {
	t.Helper()
	hs, file, repo, fname := hubRepo(t, name, seed)
	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		cfg.Hub = &hub.Client{Endpoint: hs.URL, Backoff: 20 * time.Millisecond}
	})
	waitHealthy(t, c, 0, 3, 3, 20*time.Second)
	names := []string{c.Members[1].Cfg.Name, c.Members[2].Cfg.Name}
	if _, err := c.Client(0, tc.Secret).LoadModel(ctx(t), api.LoadModelRequest{Hub: repo + ":Q8_0", Name: name, Nodes: names, Strategy: "pipeline", Ctx: 256}); err != nil {
		t.Fatal(err)
	}
	return c, hs, file, repo, fname
}

// waitModelReady waits up to a minute for model name to be ready on the
// first agent. A failed model fails the test at once; degraded (a shard
// that could not start and retries: under load the leader may change, or
// a holder be suspect, mid-check) is logged and waited out, and fails the
// test only if it lasts the minute.
func waitModelReady(t *testing.T, c *tc.Cluster, name string) *api.ModelInfo {
	t.Helper()
	var info *api.ModelInfo
	last := ""
	tc.Eventually(t, 60*time.Second, name+" ready", func() bool {
		info = modelInfo(t, c, 0, name)
		if info == nil {
			return false
		}
		if info.Status == "failed" {
			t.Fatalf("%s failed: %s", name, info.Reason)
		}
		if info.Status == "degraded" && info.Reason != last {
			last = info.Reason
			t.Logf("%s degraded for now (it retries): %s", name, info.Reason)
		}
		return info.Status == "ready"
	})
	return info
}

// hubRepo serves a small random Q8_0 model named name on a fake hub, as
// repo org/NAME-GGUF, file NAME-q8_0.gguf.
func hubRepo(t *testing.T, name string, seed uint64) (hs *hubtest.Server, file []byte, repo, fname string) {
	t.Helper()
	path := enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 4, NHead: 4, NHeadKV: 2, NFF: 512, Type: "q8_0", Seed: seed, Name: name})
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	repo, fname = "org/"+name+"-GGUF", name+"-q8_0.gguf"
	hs = hubtest.New(t)
	hs.AddRepo(repo, map[string][]byte{fname: file})
	return hs, file, repo, fname
}

// TestHubLoadUnreachableSaysAgentEnv: model load --hub on an agent that
// cannot reach its hub answers an error that names that hub and says the
// agent reads HF_ENDPOINT and HF_TOKEN from its own environment (a user
// who set them in the shell that runs the CLI sees why they did nothing).
func TestHubLoadUnreachableSaysAgentEnv(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // nothing listens there now
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.Hub = &hub.Client{Endpoint: dead.URL, Backoff: time.Millisecond, MaxAttempts: 1}
	})
	waitHealthy(t, c, 0, 1, 1, 20*time.Second)
	_, err := c.Client(0, tc.Secret).LoadModel(ctx(t), api.LoadModelRequest{Hub: "org/tiny-GGUF:Q8_0"})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusBadGateway {
		t.Fatalf("load from an unreachable hub: %v, want a 502", err)
	}
	for _, want := range []string{dead.URL, "HF_ENDPOINT", "HF_TOKEN", "agent process's own environment", c.Members[0].Cfg.Name} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}

// TestHubReloadAfterUnload (issue #38): a hub model unloaded while its
// check still waits for the nodes' ranges, then loaded again at once: the
// unload stops that check, and the second load is accepted (not refused
// as "being checked already") and becomes ready.
func TestHubReloadAfterUnload(t *testing.T) {
	const name = "again"
	hs, _, repo, _ := hubRepo(t, name, 14)
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.Hub = &hub.Client{Endpoint: hs.URL, Backoff: 20 * time.Millisecond}
	})
	waitHealthy(t, c, 0, 1, 1, 20*time.Second)
	// The node's range reads wait (the header is read at load): the check
	// cannot end before the unload.
	release := hs.Hold(func(r *http.Request) bool { return !strings.HasSuffix(r.Header.Get("User-Agent"), " header") })
	defer release()
	cl := c.Client(0, tc.Secret)
	req := api.LoadModelRequest{Hub: repo + ":Q8_0", Name: name, Ctx: 256}
	if _, err := cl.LoadModel(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	if err := cl.UnloadModel(ctx(t), name); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LoadModel(ctx(t), req); err != nil {
		t.Fatalf("loaded again right after its unload: %v", err)
	}
	release()
	waitModelReady(t, c, name)
	tc.Eventually(t, 30*time.Second, "a completion", func() bool {
		code, _ := completion(t, "http://"+c.Members[0].Agent.HTTPAddr(), name)
		return code == 200
	})
}

// TestHubLoadSameFileTwoNames (issue #38): a hub file the cluster holds
// already under another name, loaded by hub reference: from the same hub
// file loaded before, or the same bytes loaded by path. The second name
// reuses the manifest the cluster has for that sha256 (it was stuck
// degraded: "no live node has the model's manifest"); both names become
// ready and answer alike.
func TestHubLoadSameFileTwoNames(t *testing.T) {
	hs, _, repo, _ := hubRepo(t, "twice", 15)
	path := enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 4, NHead: 4, NHeadKV: 2, NFF: 512, Type: "q8_0", Seed: 16, Name: "bypath"})
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	hs.AddRepo("org/bypath-GGUF", map[string][]byte{"bypath-q8_0.gguf": file})
	c := tc.NewWith(t, 2, func(i int, cfg *node.Config) {
		cfg.Hub = &hub.Client{Endpoint: hs.URL, Backoff: 20 * time.Millisecond}
	})
	tc.Eventually(t, 20*time.Second, "a leader", func() bool {
		s, err := c.Client(0, "").Status(ctx(t))
		return err == nil && s.Leader != "" && s.NodesAlive == 2
	})
	cl := c.Client(0, tc.Secret)
	base := "http://" + c.Members[0].Agent.HTTPAddr()
	answer := func(name string) string {
		var text string
		tc.Eventually(t, 30*time.Second, name+" answers", func() bool {
			var code int
			code, text = completion(t, base, name)
			return code == 200
		})
		return text
	}
	n0, n1 := c.Members[0].Cfg.Name, c.Members[1].Cfg.Name
	for _, tt := range []struct {
		first        api.LoadModelRequest
		second, what string
		on           string // the second's node
	}{
		{api.LoadModelRequest{Hub: repo + ":Q8_0", Name: "first", Nodes: []string{n1}, Ctx: 256}, "second", "the same hub file", n0},
		// The file's node loads it from the hub too (as shoal up --model
		// REF loads the store's file), the plan on the other node.
		{api.LoadModelRequest{Path: path, Name: "file", Nodes: []string{n0}, Ctx: 256}, "fromhub", "the same bytes by path", n1},
	} {
		if _, err := cl.LoadModel(ctx(t), tt.first); err != nil {
			t.Fatal(err)
		}
		waitModelReady(t, c, tt.first.Name)
		ref := repo + ":Q8_0"
		if tt.first.Path != "" {
			ref = "org/bypath-GGUF:Q8_0"
		}
		before := len(hs.Requests())
		if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Hub: ref, Name: tt.second, Nodes: []string{tt.on}, Ctx: 256}); err != nil {
			t.Fatalf("%s: %v", tt.what, err)
		}
		waitModelReady(t, c, tt.second)
		// Its node reads the ranges from the nodes that hold them.
		var read int64
		for _, r := range hs.Requests()[before:] {
			if !strings.HasSuffix(r.UserAgent, " header") {
				read += r.Bytes
			}
		}
		if read != 0 {
			t.Errorf("%s: %s read %d bytes from the hub; the cluster holds the file", tt.what, tt.second, read)
		}
		if a, b := answer(tt.first.Name), answer(tt.second); a != b {
			t.Errorf("%s: %s answers %q, %s %q", tt.what, tt.first.Name, a, tt.second, b)
		}
	}
}
