//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// attackSuite is what TestAttacks' subtests share: the nodes beyond the
// attackEnv's, the credentials and the state each subtest must leave.
type attackSuite struct {
	mallory, victim, joiner, holder *proc
	malloryTLS                      string
	servers                         []string // QUIC addresses of the leader and of the follower
	modelFile                       string   // the tiny model's file
	admin, join, read               newToken
	// after checks that the state is the one the subtests leave (see
	// want in TestAttacks) and that the cluster serves; track takes a
	// token the subtest made into that state.
	after func(t *testing.T)
	track func(t *testing.T, id string) string
}

// gossipIsNoAuthority runs the attacks of issue #33 ("Gossip is not an
// authority"), each as a subtest of TestAttacks: a client node (or a
// removed one) that holds the gossip key gossips members the cluster must
// not believe, and writes, floods and requests an admitted node could
// send. Each attack must be refused or bounded, leave the state as it
// was and leave the cluster serving.
func (a *attackEnv) gossipIsNoAuthority(t *testing.T, s *attackSuite) {
	server, client, box := a.server, a.client, a.box
	mallory := s.mallory

	t.Run("metrics need a key", func(t *testing.T) {
		for _, p := range []*proc{server, client} {
			u := "https://" + p.ip + ":7948/metrics"
			if h := a.http(t, box, "GET", u, "", ""); h.Status != 401 {
				t.Errorf("GET %s without a key: %d %.200s; want 401", u, h.Status, h.Body)
			}
			if h := a.http(t, box, "GET", u, a.inferenceKey, ""); h.Status != 401 && h.Status != 403 {
				t.Errorf("GET %s with an inference key: %d %.200s; want 401 or 403", u, h.Status, h.Body)
			}
			if h := a.http(t, box, "GET", u, s.read.Secret, ""); h.Status != 200 || !strings.Contains(h.Body, "go_goroutines") {
				t.Errorf("GET %s with a read key: %d %.200s; want 200 with the metrics", u, h.Status, h.Body)
			}
		}
		// --metrics-public serves them without a key.
		tok := a.createToken(t, "--description", "open-metrics join token")
		s.track(t, tok.ID)
		dir := filepath.Join(s.holder.dir, "open-metrics")
		r := a.background(t, s.holder, "agent", "--name", "open-metrics", "--data-dir", dir, "--bind", s.holder.ip,
			"--join", server.ip, "--token", tok.Secret, "--metrics-public", "--threads", "1", "--log-level", "info")
		a.waitNode(t, "open-metrics", r, 30*time.Second)
		u := "https://" + s.holder.ip + ":7948/metrics"
		var h attackResult
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			// (The agent serves HTTPS once a server signed its certificate.)
			if h = a.http(t, box, "GET", u, "", ""); h.Status > 0 || time.Now().After(deadline) {
				break
			}
		}
		if h.Status != 200 || !strings.Contains(h.Body, "go_goroutines") {
			t.Errorf("GET %s (--metrics-public) without a key: %d %.200s; want 200", u, h.Status, h.Body)
		}
		a.remove(t, "open-metrics", r)
		s.after(t)
	})

	t.Run("control characters in a node name", func(t *testing.T) {
		for i, name := range []string{"evil\x1b[31m", "evil\nname"} {
			r := a.agent(t, "--name", name, "--data-dir", filepath.Join(box.dir, "ctl-"+strconv.Itoa(i)), "--token", s.join.Secret)
			r.refused(t, "node name", 10*time.Second)
			if strings.ContainsAny(r.stderr, "\x1b") {
				t.Errorf("the agent's output holds the raw escape byte:\n%q", tail(r.stderr, 5))
			}
			if n := strings.Count(strings.TrimRight(r.stderr, "\n"), "\n"); n != 0 {
				t.Errorf("agent --name %q printed %d lines, want one:\n%s", name, n+1, r.stderr)
			}
			// Sent on a join stream, past the agent's own check.
			res := a.attack(t, box, "join", "--server", server.ip+":7947", "--token", s.join.Secret, "--name", name)
			if len(res.Attempts) != 1 || res.Attempts[0].Code < 400 || res.Attempts[0].Code > 499 || !strings.Contains(res.Attempts[0].Err, "name") {
				t.Errorf("join request named %q: %+v; want a 4xx refusal about the name", name, res.Attempts)
			}
		}
		// A plain name is admitted on the same path (the check proves something).
		res := a.attack(t, box, "join", "--server", server.ip+":7947", "--token", s.join.Secret, "--name", "plain-name-0")
		if len(res.Attempts) != 1 || res.Attempts[0].Code != 0 {
			t.Errorf("join request named plain-name-0: %+v; want a certificate", res.Attempts)
		}
		s.after(t)
	})

	t.Run("model load of a FIFO", func(t *testing.T) {
		fifo := filepath.Join(a.dir, "fifo.gguf")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Unblock whatever opened it for reading, then remove it.
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			os.Remove(fifo)
		})
		r := a.exec(box, 30*time.Second, []string{"SHOAL_ADDR=" + server.ip + ":7948", "SHOAL_TOKEN=" + a.key, "SHOAL_CACERT=" + a.caCert()},
			a.bin, "model", "load", fifo, "--name", "fifo", "-o", "json")
		t.Logf("shoal model load %s: exit %d after %v: %s", fifo, r.code, r.took.Round(time.Millisecond), r.errLine())
		if r.code == 0 || r.code == -1 || r.took > 10*time.Second || r.errLine() == "" {
			t.Errorf("shoal model load of a FIFO: exit %d after %v, %q; want an error within 10 s\n%s", r.code, r.took.Round(time.Millisecond), r.errLine(), tail(r.stderr, 5))
		}
		if _, err := a.shoal(t, a.key, "status"); err != nil {
			t.Errorf("the agent does not answer after the FIFO load: %v", err)
		}
		if a.hasModel(t, "fifo") {
			t.Errorf("the FIFO is registered as model \"fifo\"")
			_, _ = a.shoal(t, a.key, "model", "unload", "fifo")
		}
		s.after(t)
	})

	t.Run("layout in 1-byte pieces", func(t *testing.T) {
		pid := server.cmd.Process.Pid
		before := rss(t, pid)
		var pieces []string
		for i := 1; i <= 32; i++ {
			pieces = append(pieces, strconv.Itoa(i))
		}
		r := a.attackFor(t, mallory, 2*time.Minute, "layout", "--tls", s.malloryTLS, "--server", server.ip+":7947", "--bind", mallory.ip,
			"--model", a.model, "--pieces", strings.Join(pieces, ","))
		time.Sleep(time.Second)
		after := rss(t, pid)
		t.Logf("n0's RSS %d MB before, %d MB after; %d piece checksums in %d bytes of replies", before>>20, after>>20, r.Sums, r.Bytes)
		if len(r.Attempts) != len(pieces) {
			t.Fatalf("attempts: %+v", r.Attempts)
		}
		for _, at := range r.Attempts {
			if at.Code < 400 || at.Code > 499 {
				t.Errorf("%s: code %d %q; want a 4xx refusal", at.Name, at.Code, at.Err)
			}
		}
		if after > before+100<<20 {
			t.Errorf("n0's RSS grew from %d MB to %d MB", before>>20, after>>20)
		}
		// The layout an agent asks for is still served: the default piece size.
		r = a.attack(t, mallory, "layout", "--tls", s.malloryTLS, "--server", server.ip+":7947", "--bind", mallory.ip, "--model", a.model, "--pieces", "0")
		if len(r.Attempts) != 1 || r.Attempts[0].Code != 0 || r.Sums == 0 {
			t.Errorf("layout with the default piece size: %+v, %d sums", r.Attempts, r.Sums)
		}
		s.after(t)
	})

	t.Run("dist.open flood", func(t *testing.T) {
		r := a.attackFor(t, mallory, 2*time.Minute, "dist-open", "--tls", s.malloryTLS, "--server", server.ip+":7947", "--bind", mallory.ip,
			"--model", a.model, "--count", "400", "--timeout-ms", "600000")
		t.Logf("400 dist.open from mallory: %d opened in %.1f s, refusals by code %v", r.Opened, r.Seconds, r.Codes)
		if r.Opened >= 400 {
			t.Errorf("all 400 sessions opened: no cap")
		}
		if r.Opened+sum(r.Codes) != 400 {
			t.Errorf("%d opened + %v refused != 400", r.Opened, r.Codes)
		}
		a.checkServing(t)
		// Another node still opens a session (and closes it) at once: the
		// cap is the flooder's, not the member's.
		clientTLS := filepath.Join(client.dir, "tls")
		if r := a.attack(t, client, "dist-open", "--tls", clientTLS, "--server", server.ip+":7947", "--bind", client.ip,
			"--model", a.model, "--count", "1", "--close"); r.Opened != 1 {
			t.Errorf("a session from n1 after the flood: %+v", r.Attempts)
		}
		// Once the attacker is gone its sessions are reclaimed: mallory's
		// node opens one again (and closes it).
		var last attackResult
		t0 := time.Now()
		for deadline := t0.Add(100 * time.Second); ; time.Sleep(5 * time.Second) {
			last = a.attack(t, mallory, "dist-open", "--tls", s.malloryTLS, "--server", server.ip+":7947", "--bind", mallory.ip,
				"--model", a.model, "--count", "1", "--close")
			if last.Opened == 1 || time.Now().After(deadline) {
				break
			}
		}
		if last.Opened != 1 {
			t.Errorf("mallory's sessions not reclaimed 100 s after the flood: %+v", last.Attempts)
		} else {
			t.Logf("mallory opened a session again %v after the flood", time.Since(t0).Round(time.Second))
		}
		s.after(t)
	})

	t.Run("idle RPC stream flood", func(t *testing.T) {
		base := a.goroutines(t, server, s.read.Secret)
		bg := a.attackBG(t, mallory, "streams", "--tls", s.malloryTLS, "--server", server.ip+":7947", "--bind", mallory.ip,
			"--conns", "4", "--per", "4000", "--window", "15s")
		time.Sleep(6 * time.Second)
		during := a.goroutines(t, server, s.read.Secret)
		a.checkServing(t)
		r := bg.wait(t, 3*time.Minute)
		t.Logf("4 x 4000 idle RPC streams: %d opened in %.1f s (%d opens left waiting), %d closed by n0 within 15 s, %d held; %v",
			r.Opened, r.Seconds, r.Blocked, r.Closed, r.Held, r.Codes)
		if r.Held > 1024 {
			t.Errorf("%d idle streams still open 15 s after the attacker opened them (of %d opened): unbounded", r.Held, r.Opened)
		}
		var now int
		t0 := time.Now()
		for deadline := t0.Add(30 * time.Second); ; time.Sleep(time.Second) {
			now = a.goroutines(t, server, s.read.Secret)
			if now <= base+300 || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("n0's goroutines: %d before, %d during the flood, %d %v after it", base, during, now, time.Since(t0).Round(time.Second))
		if now > base+300 {
			t.Errorf("n0 runs %d goroutines 30 s after the flood, %d before", now, base)
		}
		s.after(t)
	})

	t.Run("request body trickled a byte a second", func(t *testing.T) {
		bg := a.attackBG(t, box, "trickle", "--url", "https://"+server.ip+":7948/v1/chat/completions", "--cacert", a.caCert(),
			"--key", a.inferenceKey, "--limit", "150s")
		time.Sleep(5 * time.Second)
		a.checkServing(t)
		r := bg.wait(t, 4*time.Minute)
		t.Logf("trickled body: connection closed after %.1f s, answered %d %.100q after %.1f s, %d body bytes sent", r.ClosedAfter, r.Status, r.Body, r.AnsweredAfter, r.Sent)
		if r.ClosedAfter <= 0 || r.ClosedAfter > 120 {
			t.Errorf("the server kept a request whose body comes a byte a second for %.1f s (-1: past the 150 s limit); want it closed within 120 s", r.ClosedAfter)
		}
		s.after(t)
	})

	t.Run("rogue server gossiped with the cluster key", func(t *testing.T) {
		var me viewNode
		for _, n := range a.view(t).nodes {
			if n.Name == mallory.name {
				me = n
			}
		}
		// (Each on a QUIC port of its own: what reaches one was meant for it.)
		for _, c := range []struct {
			what, id, quic string
			legit          *viewNode
		}{{"a fresh node ID", newNodeID(t), "7957", nil}, {"mallory's own ID", me.ID, "7959", &me}} {
			t.Logf("gossiping a server named rogue with %s (%s)", c.what, c.id)
			args := []string{"gossip", "--tls", s.malloryTLS, "--bind", mallory.ip, "--join", server.ip + ":7946",
				"--gossip-port", "7956", "--listen", "--quic-port", c.quic, "--fake-id", c.id, "--name", "rogue", "--role", "server",
				"--duration", "20s"}
			if c.legit != nil {
				// Leaving as mallory would tell every member that the real
				// mallory left (gossip carries liveness), which is not what
				// this checks.
				args = append(args, "--no-leave")
			}
			bg := a.attackBG(t, mallory, args...)
			a.watchOut(t, bg, c.id, c.legit)
			r := bg.wait(t, time.Minute)
			t.Logf("the attacker's endpoint received streams %v, RPCs %v (gossip join contacted %d)", r.Streams, r.Methods, r.Joined)
			if r.Joined == 0 {
				t.Errorf("the attacker never joined gossip: %+v (the test proves nothing)", r.Attempts)
			}
			if r.Streams["raft"] > 0 {
				t.Errorf("the rogue member's endpoint received %d Raft streams", r.Streams["raft"])
			}
		}
		a.settle(t)
		s.after(t)
	})

	t.Run("removed node gossips a new member", func(t *testing.T) {
		tok := a.createToken(t, "--description", "ghost's join token")
		s.track(t, tok.ID)
		dir := filepath.Join(s.victim.dir, "ghost")
		g := a.background(t, s.victim, "agent", "--name", "ghost", "--data-dir", dir, "--bind", s.victim.ip,
			"--join", server.ip, "--token", tok.Secret, "--threads", "1", "--log-level", "info")
		ghostID := a.waitNode(t, "ghost", g, 30*time.Second)
		a.remove(t, "ghost", g)
		a.waitGone(t, ghostID, 20*time.Second)
		ghostTLS := filepath.Join(dir, "tls")
		for _, role := range []string{"server", "client"} {
			id := newNodeID(t)
			t.Logf("the removed node gossips a %s %s", role, id)
			bg := a.attackBG(t, s.victim, "gossip", "--tls", ghostTLS, "--bind", s.victim.ip, "--join", server.ip+":7946",
				"--gossip-port", "7946", "--listen", "--quic-port", "7947", "--fake-id", id, "--name", "ghost2", "--role", role,
				"--duration", "15s")
			a.watchOut(t, bg, id, nil)
			r := bg.wait(t, time.Minute)
			t.Logf("the attacker's endpoint received streams %v, RPCs %v (gossip join contacted %d)", r.Streams, r.Methods, r.Joined)
			if r.Streams["raft"] > 0 {
				t.Errorf("the removed node's new member received %d Raft streams", r.Streams["raft"])
			}
			a.notAlive(t, ghostID)
		}
		a.settle(t)
		s.after(t)
	})

	t.Run("node gossips another node's name", func(t *testing.T) {
		// A client node of its own (mallory's agent keeps running): its
		// agent is stopped, and the attacker takes its place at its
		// addresses, with its certificate and node ID, gossiping the name
		// n0.
		tok := a.createToken(t, "--description", "namer's join token")
		s.track(t, tok.ID)
		dir := filepath.Join(s.joiner.dir, "namer")
		n := a.background(t, s.joiner, "agent", "--name", "namer", "--data-dir", dir, "--bind", s.joiner.ip,
			"--join", server.ip, "--token", tok.Secret, "--threads", "1", "--log-level", "info")
		namerID := a.waitNode(t, "namer", n, 30*time.Second)
		n.kill()
		serverID := a.view(t).id(t, server.name)
		bg := a.attackBG(t, s.joiner, "gossip", "--tls", filepath.Join(dir, "tls"), "--bind", s.joiner.ip, "--join", server.ip+":7946",
			"--gossip-port", "7946", "--listen", "--quic-port", "7947", "--fake-id", namerID, "--name", server.name, "--role", "client",
			"--duration", "20s", "--cert-after", "10s", "--cert-servers", strings.Join(s.servers, ","))
		seen := map[string]bool{} // each finding once
		report := func(key, format string, args ...any) {
			if !seen[key] {
				seen[key] = true
				t.Errorf(format, args...)
			}
		}
		for {
			n0s := 0
			for _, nd := range a.view(t).nodes {
				if nd.Name == server.name {
					n0s++
					if nd.ID != serverID {
						report("listed", "node ls lists %s as %q", nd.ID, nd.Name)
					}
				}
				if nd.ID == namerID && nd.Name != "namer" {
					report("renamed", "namer's node is named %q in the state", nd.Name)
				}
			}
			if n0s != 1 {
				report("count", "node ls lists %d nodes named n0", n0s)
			}
			if bg.exited() {
				break
			}
			time.Sleep(time.Second)
		}
		r := bg.wait(t, time.Minute)
		t.Logf("HTTPS certificates signed for namer's identity name %v; attempts %+v", r.DNSNames, r.Attempts)
		got := map[string]bool{}
		for _, d := range r.DNSNames {
			got[d] = true
		}
		if got[server.name] || got[server.ip] {
			t.Errorf("a server signed an HTTPS certificate for n0's name or address to namer: %v", r.DNSNames)
		}
		if !got["namer"] {
			t.Errorf("no HTTPS certificate naming namer (the certificate's name): %v %+v", r.DNSNames, r.Attempts)
		}
		if _, err := a.shoal(t, a.key, "node", "rm", namerID); err != nil {
			t.Error(err)
		}
		a.waitGone(t, namerID, 30*time.Second)
		s.after(t)
	})

	t.Run("phantom member with 4000 GiB", func(t *testing.T) {
		id := newNodeID(t)
		bg := a.attackBG(t, mallory, "gossip", "--tls", s.malloryTLS, "--bind", mallory.ip, "--join", server.ip+":7946",
			"--gossip-port", "7958", "--quic-port", "7999", "--fake-id", id, "--name", "phantom", "--role", "client",
			"--mem-gib", "4000", "--cores", "256", "--duration", "150s")
		check := func() {
			for _, n := range a.view(t).nodes {
				if n.ID == id {
					t.Errorf("node ls lists the phantom: %+v", n)
				}
			}
		}
		time.Sleep(8 * time.Second) // reconcile passes of the leader
		check()
		bait := filepath.Join(a.dir, "bait.gguf")
		if out, err := exec.Command(a.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "64", "--n-layer", "2",
			"--n-head", "4", "--n-ff", "128", "--vocab-size", "512", "--ctx", "256", "--seed", "11", "-q", "--out", bait).CombinedOutput(); err != nil {
			t.Fatalf("gen-model: %v\n%s", err, out)
		}
		r := a.exec(box, 90*time.Second, []string{"SHOAL_ADDR=" + server.ip + ":7948", "SHOAL_TOKEN=" + a.key, "SHOAL_CACERT=" + a.caCert()},
			a.bin, "model", "load", bait, "--name", "bait", "--wait", "60s", "-o", "json")
		defer func() { _, _ = a.shoal(t, a.key, "model", "unload", "bait") }()
		if r.code != 0 {
			t.Errorf("shoal model load bait: exit %d after %v: %s", r.code, r.took.Round(time.Millisecond), tail(r.stderr, 5))
		}
		pr, err := a.shoal(t, a.key, "placement", "show", "bait")
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Status string `json:"status"`
			Stages []struct {
				Members []struct {
					Node     string `json:"node"`
					NodeName string `json:"node_name"`
				} `json:"members"`
			} `json:"stages"`
			Nodes []struct {
				Node string `json:"node"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(pr.stdout), &p); err != nil {
			t.Fatal(err)
		}
		var on []string
		for _, st := range p.Stages {
			for _, m := range st.Members {
				on = append(on, m.NodeName)
				if m.Node == id {
					t.Errorf("the plan of bait places layers on the phantom")
				}
			}
		}
		for _, n := range p.Nodes {
			if n.Node == id {
				t.Errorf("the plan of bait lists the phantom")
			}
		}
		t.Logf("bait: %s, on %v", p.Status, on)
		body := `{"model":"bait","messages":[{"role":"user","content":"Hello"}],"max_tokens":4}`
		for _, host := range []string{server.ip, client.ip} {
			// (An agent that does not drive the model learns of it from
			// the state it reads, which may lag the load by a moment.)
			var h attackResult
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
				if h = a.http(t, box, "POST", "https://"+host+":7948/v1/chat/completions", a.inferenceKey, body); h.Status == 200 || time.Now().After(deadline) {
					break
				}
			}
			if h.Status != 200 {
				t.Errorf("chat with bait via %s: %d %.200s", host, h.Status, h.Body)
			}
		}
		check()
		res := bg.stop(t)
		if res.Joined == 0 {
			t.Errorf("the phantom never joined gossip: %+v (the test proves nothing)", res.Attempts)
		}
		if _, err := a.shoal(t, a.key, "model", "unload", "bait"); err != nil {
			t.Error(err)
		}
		a.settle(t)
		s.after(t)
	})

	t.Run("unknown command type with the admin key", func(t *testing.T) {
		for _, rpc := range s.servers {
			r := a.attack(t, mallory, "unknown-type", "--tls", s.malloryTLS, "--server", rpc, "--bind", mallory.ip, "--key", s.admin.Secret)
			if len(r.Attempts) != 2 {
				t.Fatalf("attempts: %+v", r.Attempts)
			}
			for _, at := range r.Attempts {
				if at.Code != 400 {
					t.Errorf("%s via %s: %d %q; want 400", at.Name, rpc, at.Code, at.Err)
				}
			}
		}
		time.Sleep(2 * time.Second)
		a.serversRun(t)
		s.after(t)
	})

	t.Run("client node reports a model of 2^40 experts", func(t *testing.T) {
		for i, rpc := range s.servers {
			name := "bomb" + strconv.Itoa(i)
			r := a.attack(t, mallory, "model-bomb", "--tls", s.malloryTLS, "--server", rpc, "--bind", mallory.ip, "--key", s.admin.Secret,
				"--model", a.model, "--name", name)
			if len(r.Attempts) != 2 {
				t.Fatalf("attempts: %+v", r.Attempts)
			}
			for _, at := range r.Attempts {
				if at.Code < 400 || at.Code > 499 {
					t.Errorf("%s via %s: %d %q; want a 4xx refusal", at.Name, rpc, at.Code, at.Err)
				}
			}
		}
		time.Sleep(3 * time.Second) // a leader's planner would be at it
		a.serversRun(t)
		for i := range s.servers {
			if name := "bomb" + strconv.Itoa(i); a.hasModel(t, name) {
				t.Errorf("model %s is in the state", name)
			}
		}
		s.after(t)
	})
}

// restartServers is TestAttacks' last subtest: both servers are stopped
// (the leader with kill -9, the follower with SIGTERM) and started again
// from their data dirs; a leader must come back, with the state the
// attacks left, and the model must serve. A command an attack managed to
// put in the Raft log that a server cannot apply would stop them here.
func (a *attackEnv) restartServers(t *testing.T, s *attackSuite) {
	t.Run("restart of every server comes back to a leader", func(t *testing.T) {
		pids := []int{a.server.cmd.Process.Pid, a.server2.cmd.Process.Pid}
		a.kill(a.server, syscall.SIGKILL)
		a.kill(a.server2, syscall.SIGTERM)
		t0 := time.Now()
		a.start(a.server)
		a.start(a.server2)
		t.Logf("n0 (pid %d, kill -9) and s1 (pid %d, SIGTERM) restarted as pids %d and %d", pids[0], pids[1], a.server.cmd.Process.Pid, a.server2.cmd.Process.Pid)
		a.waitAlive(t, 4, 90*time.Second)
		t.Logf("a leader and 4 live nodes %v after the restart", time.Since(t0).Round(time.Millisecond))
		a.waitServing(t, 90*time.Second)
		t.Logf("the model serves %v after the restart", time.Since(t0).Round(time.Millisecond))
		s.after(t)
	})
}

// attackFor is attack with a time limit other than 30 s.
func (a *attackEnv) attackFor(t *testing.T, p *proc, timeout time.Duration, args ...string) attackResult {
	t.Helper()
	r := a.exec(p, timeout, nil, a.attacker, args...)
	return parseAttack(t, args[0], r)
}

func parseAttack(t *testing.T, cmd string, r ran) attackResult {
	t.Helper()
	var res attackResult
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
		t.Fatalf("attacker %s: exit %d after %v\n%s%s", cmd, r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
	}
	for _, at := range res.Attempts {
		t.Logf("attacker %s: %d %s", at.Name, at.Code, at.Err)
	}
	return res
}

// bgAttack is an attacker process running in the background.
type bgAttack struct {
	cmd       *exec.Cmd
	cmdName   string
	out, errb bytes.Buffer
	started   time.Time
	done      chan struct{}
	res       ran
}

// attackBG starts the attacker in p's namespace; it is killed when the
// test ends if it still runs.
func (a *attackEnv) attackBG(t *testing.T, p *proc, args ...string) *bgAttack {
	t.Helper()
	b := &bgAttack{cmdName: args[0], done: make(chan struct{}), started: time.Now()}
	b.cmd = exec.Command("ip", append([]string{"netns", "exec", p.ns, a.attacker}, args...)...)
	b.cmd.Stdout, b.cmd.Stderr = &b.out, &b.errb
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := b.cmd.Wait()
		b.res = ran{stdout: b.out.String(), stderr: b.errb.String(), took: time.Since(b.started)}
		if ee, ok := err.(*exec.ExitError); ok {
			b.res.code = ee.ExitCode()
		} else if err != nil {
			b.res.code = -2
		}
		close(b.done)
	}()
	t.Cleanup(func() {
		if !b.exited() {
			_ = b.cmd.Process.Kill()
			<-b.done
		}
	})
	return b
}

func (b *bgAttack) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// wait waits for the attacker's result, at most timeout.
func (b *bgAttack) wait(t *testing.T, timeout time.Duration) attackResult {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		_ = b.cmd.Process.Kill()
		<-b.done
		t.Fatalf("attacker %s still ran after %v:\n%s", b.cmdName, timeout, tail(b.res.stderr, 10))
	}
	return parseAttack(t, b.cmdName, b.res)
}

// stop ends the attacker with SIGTERM and returns what it printed.
func (b *bgAttack) stop(t *testing.T) attackResult {
	t.Helper()
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	return b.wait(t, 30*time.Second)
}

// watchOut checks, until the attacker bg exits, that the member id it
// gossips is never a Raft server, and never a node of the state unless
// legit is that node (its name and role must stay).
func (a *attackEnv) watchOut(t *testing.T, bg *bgAttack, id string, legit *viewNode) {
	t.Helper()
	seenNode, seenServer := false, false
	for !bg.exited() {
		for _, n := range a.view(t).nodes {
			if n.ID != id || seenNode {
				continue
			}
			if legit == nil || n.Name != legit.Name || n.Role != legit.Role {
				seenNode = true
				t.Errorf("node ls lists the gossiped member: %+v", n)
			}
		}
		st := a.status(t)
		for _, srv := range st.Servers {
			if srv.ID == id && !seenServer {
				seenServer = true
				t.Errorf("the gossiped member %s is a Raft server (voter %v): %+v", id, srv.Voter, st.Servers)
			}
		}
		time.Sleep(time.Second)
	}
}

// status is 'shoal status' with the admin key.
func (a *attackEnv) status(t *testing.T) status {
	t.Helper()
	r, err := a.shoal(t, a.key, "status")
	if err != nil {
		t.Fatal(err)
	}
	var s status
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// settle waits (at most 40 s) for the status to show the two servers and
// four live nodes again after an attack on gossip: a member that left
// may take a few probe rounds to be forgotten, and a node whose ID the
// attacker took may be suspected until a push/pull sync (every 30 s)
// lets it refute.
func (a *attackEnv) settle(t *testing.T) {
	t.Helper()
	var s status
	t0 := time.Now()
	for deadline := t0.Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if s = a.status(t); s.Leader != "" && len(s.Servers) == 2 && s.NodesAlive == 4 {
			if d := time.Since(t0); d > 5*time.Second {
				t.Logf("status back to 2 servers and 4 live nodes %v after the attack", d.Round(time.Second))
			}
			return
		}
	}
	t.Logf("status 40 s after the attack: %+v", s)
}

// serversRun checks that both server processes still run.
func (a *attackEnv) serversRun(t *testing.T) {
	t.Helper()
	for _, p := range []*proc{a.server, a.server2} {
		if p.cmd == nil || p.cmd.Process == nil || syscall.Kill(p.cmd.Process.Pid, 0) != nil || p.cmd.ProcessState != nil {
			t.Errorf("server %s stopped:\n%s", p.name, tail(a.logOf(p), 20))
		}
	}
}

func (a *attackEnv) logOf(p *proc) string {
	b, _ := os.ReadFile(filepath.Join(a.dir, p.name+".log"))
	return string(b)
}

// hasModel reports whether 'shoal model ls' lists model name.
func (a *attackEnv) hasModel(t *testing.T, name string) bool {
	t.Helper()
	r, err := a.shoal(t, a.key, "model", "ls")
	if err != nil {
		t.Fatal(err)
	}
	var ms []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ms); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == name {
			return true
		}
	}
	return false
}

// goroutines is the go_goroutines metric of agent p, read with key.
func (a *attackEnv) goroutines(t *testing.T, p *proc, key string) int {
	t.Helper()
	h := a.http(t, a.box, "GET", "https://"+p.ip+":7948/metrics", key, "")
	if h.Status != 200 {
		t.Fatalf("GET /metrics of %s: %d %.200s", p.name, h.Status, h.Body)
	}
	sc := bufio.NewScanner(strings.NewReader(h.Body))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "go_goroutines" {
			n, err := strconv.ParseFloat(f[1], 64)
			if err == nil {
				return int(n)
			}
		}
	}
	t.Fatalf("no go_goroutines in %s's metrics", p.name)
	return 0
}

// rss is the resident memory of process pid in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for process %d", pid)
	return 0
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// newNodeID is a fresh node ID in the agents' UUID form.
func newNodeID(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
