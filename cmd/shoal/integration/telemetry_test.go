//go:build integration

package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLinkTelemetry runs three agents in network namespaces, as root, with
// the default --net-telemetry auto: each counts its peers' traffic with
// eBPF (TCX on its veth), and the counts agree with quic-go's own within
// 5%. Then one veth of a node the model's plan uses is throttled (tc tbf,
// both directions): the links to it are measured slower, the plan is
// weighed again on them and moves off the node, and placement show prints
// the slow links the re-plan used.
func TestLinkTelemetry(t *testing.T) {
	e := setup(t, 3)
	cfg := filepath.Join(e.dir, "fast-probes.json")
	if err := os.WriteFile(cfg, []byte(`{"tuning": {"link_probe": "3s"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range e.nodes {
		p.args = append(p.args, "--config", cfg)
		e.start(p)
	}
	e.waitHealthy(e.nodes[0], 3, 60*time.Second)
	model := filepath.Join(e.nodes[0].dir, "tp.gguf")
	if out, err := exec.Command(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-layer", "4", "--n-embd", "512",
		"--n-head", "8", "--n-ff", "1024", "--out", model).CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v %s", err, out)
	}
	var loaded any
	if err := e.cliRetry(e.nodes[0], &loaded, 30*time.Second, "model", "load", model, "--name", "tp", "--strategy", "tensor"); err != nil {
		t.Fatal(err)
	}
	pl := e.waitPlan(t, 0, 60*time.Second)
	t.Logf("plan v%d on %v", pl.Version, pl.members())
	// The first link measurements can move the plan (it was made on
	// default links); a request in flight when its driver moves ends with
	// an error. Let the plan settle first.
	time.Sleep(8 * time.Second)
	pl = e.waitPlan(t, 0, 60*time.Second)
	t.Logf("plan v%d on %v once links were measured", pl.Version, pl.members())
	for i, moves := 0, 0; i < 5; i++ {
		err := e.chatIn(e.nodes[0], "tp", 32)
		if now := e.placement(t, e.nodes[0]); err != nil && now.Version != pl.Version && moves < 3 {
			moves++
			// The plan moved again (probes on a loaded host): a request on
			// a driver that moves ends with an error, a known limit, not
			// what this test measures. Take the new plan.
			t.Logf("chat %d: %v; the plan moved to v%d on %v", i, err, now.Version, now.members())
			pl = e.waitPlan(t, pl.Version, 60*time.Second)
			i--
			continue
		}
		if err != nil {
			if os.Getenv("SHOAL_DUMP") != "" {
				for _, p := range e.nodes {
					_ = p.cmd.Process.Signal(syscall.SIGQUIT)
				}
				time.Sleep(2 * time.Second)
			}
			t.Fatalf("chat: %v", err)
		}
	}

	// Must-show 3: eBPF counts against quic-go's, per peer and direction.
	time.Sleep(500 * time.Millisecond) // let the last acks land
	compared := 0
	scrapes := e.quietScrape(t)
	for _, p := range e.nodes {
		m := scrapes[p]
		if src := m.label("shoal_net_telemetry_info", "source"); src != "ebpf-tcx" {
			t.Fatalf("%s counts with %q, want ebpf-tcx (root, kernel with TCX): reason %q", p.name, src, m.label("shoal_net_telemetry_info", "reason"))
		}
		for _, o := range e.nodes {
			if o == p {
				continue
			}
			// Sent: eBPF on this node against quic-go's count of what this
			// node's connections sent. Received: against what the peer's
			// quic-go sent (quic-go on this node does not count datagrams
			// it drops from a full queue on a busy host: eBPF does), and
			// bracketed by the two quic-go counts: a loaded host also drops
			// packets before this node's hook (a full backlog), which the
			// peer counted as sent and no one here can see (CI run 3 of
			// session 18: 7% of one direction under CI load).
			sent := m.value("shoal_peer_bytes_total", "peer", o.name, "direction", "tx", "source", "ebpf-tcx")
			sentQUIC := m.value("shoal_peer_bytes_total", "peer", o.name, "direction", "tx", "source", "quic")
			recv := m.value("shoal_peer_bytes_total", "peer", o.name, "direction", "rx", "source", "ebpf-tcx")
			recvQUIC := m.value("shoal_peer_bytes_total", "peer", o.name, "direction", "rx", "source", "quic")
			peerSent := scrapes[o].value("shoal_peer_bytes_total", "peer", p.name, "direction", "tx", "source", "quic")
			for _, c := range []struct {
				what       string
				ebpf, quic float64
			}{{"sent", sent, sentQUIC}, {"received (vs the peer's quic-go sent)", recv, peerSent}} {
				if c.quic < 64<<10 {
					continue // too little to compare
				}
				diff := (c.ebpf - c.quic) / c.quic
				t.Logf("MEASURED %s %s %s: eBPF %.0f bytes, quic-go %.0f (%+.2f%%)", p.name, c.what, o.name, c.ebpf, c.quic, diff*100)
				switch {
				case c.what == "sent" && (diff < -0.05 || diff > 0.05):
					t.Errorf("%s %s %s: eBPF counted %.0f bytes, quic-go %.0f: off by %.1f%% (want within 5%%)", p.name, c.what, o.name, c.ebpf, c.quic, diff*100)
				case c.what != "sent" && diff > 0.01:
					t.Errorf("%s received from %s: eBPF counted %.0f bytes, more than the %.0f the peer sent (%+.1f%%)", p.name, o.name, c.ebpf, c.quic, diff*100)
				case c.what != "sent" && diff < -0.05 && (recvQUIC == 0 || c.ebpf < 0.99*recvQUIC):
					t.Errorf("%s received from %s: eBPF counted %.0f bytes, %.1f%% under the %.0f the peer sent and under this node's own quic-go count %.0f", p.name, o.name, c.ebpf, -diff*100, c.quic, recvQUIC)
				}
				compared++
			}
			if recvQUIC > 0 {
				t.Logf("  %s received from %s by its own quic-go count: %.0f (eBPF %+.2f%%)", p.name, o.name, recvQUIC, (recv-recvQUIC)/recvQUIC*100)
			}
		}
		if iface := m.label("shoal_peer_interface_info", "iface"); !strings.HasPrefix(iface, "v") {
			t.Errorf("%s: peers reached through %q, want its veth", p.name, iface)
		}
	}
	if compared < 2 {
		t.Fatalf("only %d peer directions carried enough traffic to compare", compared)
	}

	// Must-show 4: throttle a plan member's veth (the plan as it is now).
	pl = e.waitPlan(t, 0, 60*time.Second)
	var victim *proc
	for _, p := range e.nodes {
		for _, n := range pl.members() {
			if n == p.name && victim == nil {
				victim = p
			}
		}
	}
	if victim == nil {
		t.Fatalf("no plan member among %v", pl.members())
	}
	idx := strings.TrimPrefix(victim.name, "n")
	must(t, "ip", "netns", "exec", victim.ns, "tc", "qdisc", "add", "dev", "v"+idx, "root", "tbf", "rate", "20mbit", "burst", "32kb", "latency", "400ms")
	must(t, "ip", "netns", "exec", e.bridge, "tc", "qdisc", "add", "dev", e.prefix+"-b"+idx, "root", "tbf", "rate", "20mbit", "burst", "32kb", "latency", "400ms")
	t0 := time.Now()
	var moved placementView
	deadline := time.Now().Add(90 * time.Second)
	for {
		moved = e.placement(t, e.nodes[0])
		gone := true
		for _, n := range moved.members() {
			if n == victim.name {
				gone = false
			}
		}
		// A link's estimate is the best of its last 3 probes: it reads
		// slow once every one of them ran after the throttle.
		slowLinks, victimLinks := 0, 0
		for _, l := range moved.Links {
			if l.From == victim.name || l.To == victim.name {
				victimLinks++
				if l.Gbit <= 0.05 {
					slowLinks++
				}
			}
		}
		if moved.Version > pl.Version && gone && victimLinks == 2*(len(e.nodes)-1) && slowLinks == victimLinks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no re-plan off %s within 90 s of the throttle: v%d on %v; links %+v", victim.name, moved.Version, moved.members(), moved.Links)
		}
		time.Sleep(time.Second)
	}
	t.Logf("MEASURED re-planned off the throttled %s %.1f s after the throttle: v%d on %v", victim.name, time.Since(t0).Seconds(), moved.Version, moved.members())
	slow := 0
	for _, l := range moved.Links {
		if l.From == victim.name || l.To == victim.name {
			t.Logf("link %s -> %s: %.3f Gbit/s (probe %.3f, live %.3f), %s, via %s", l.From, l.To, l.Gbit, l.ProbeGbit, l.LiveGbit, l.Source, l.Iface)
			if l.Gbit > 0.05 {
				t.Errorf("link %s -> %s still at %.3f Gbit/s after a 20 Mbit/s throttle", l.From, l.To, l.Gbit)
			}
			slow++
		}
	}
	if slow == 0 {
		t.Fatalf("placement show names no link of the throttled %s: %+v", victim.name, moved.Links)
	}
	show := exec.Command("ip", "netns", "exec", e.nodes[0].ns, e.bin, "placement", "show", "tp")
	show.Env = append(os.Environ(), "SHOAL_ADDR="+e.nodes[0].ip+":7948", "SHOAL_TOKEN="+secret,
		"SHOAL_CACERT="+filepath.Join(e.nodes[0].dir, "tls", "https-ca.pem"))
	out, err := show.CombinedOutput()
	if err != nil {
		t.Fatalf("placement show: %v %s", err, out)
	}
	if !strings.Contains(string(out), "links of the plan's nodes") {
		t.Fatalf("placement show prints no links:\n%s", out)
	}
	t.Logf("placement show:\n%s", out)
	// The new plan serves once its shards are in (a node may fetch from
	// the throttled one, which has the file).
	var entry *proc
	for _, p := range e.nodes {
		if p != victim {
			entry = p
		}
	}
	deadline = time.Now().Add(90 * time.Second)
	for {
		err := e.chatIn(entry, "tp", 8)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chat on the new plan: %v", err)
		}
		time.Sleep(time.Second)
	}
}

type placementView struct {
	Version uint64 `json:"version"`
	Stages  []struct {
		Members []struct {
			NodeName string `json:"node_name"`
		} `json:"members"`
	} `json:"stages"`
	Links []struct {
		From      string  `json:"from"`
		To        string  `json:"to"`
		Gbit      float64 `json:"gbit"`
		ProbeGbit float64 `json:"probe_gbit"`
		LiveGbit  float64 `json:"live_gbit"`
		Source    string  `json:"source"`
		Iface     string  `json:"iface"`
	} `json:"links"`
}

func (p placementView) members() []string {
	var out []string
	for _, s := range p.Stages {
		for _, m := range s.Members {
			out = append(out, m.NodeName)
		}
	}
	return out
}

func (e *env) placement(t *testing.T, p *proc) placementView {
	t.Helper()
	var v placementView
	if err := e.cli(p, &v, "placement", "show", "tp"); err != nil {
		t.Logf("placement show: %v", err)
	}
	return v
}

func (e *env) waitPlan(t *testing.T, after uint64, timeout time.Duration) placementView {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := e.placement(t, e.nodes[0])
		if v.Version > after && len(v.members()) > 0 {
			if err := e.chatIn(e.nodes[0], "tp", 1); err == nil {
				return v
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("model tp not served within %v: %+v", timeout, v)
		}
		time.Sleep(time.Second)
	}
}

func (e *env) cliRetry(p *proc, out any, timeout time.Duration, args ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		err := e.cli(p, out, args...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// chatIn sends a chat completion from inside p's namespace with curl.
func (e *env) chatIn(p *proc, model string, maxTokens int) error {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, model, maxTokens)
	out, err := exec.Command("ip", "netns", "exec", p.ns, "curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}",
		"--cacert", filepath.Join(p.dir, "tls", "https-ca.pem"), "-H", "Authorization: Bearer "+secret,
		"-H", "Content-Type: application/json", "-d", body, "https://"+p.ip+":7948/v1/chat/completions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("curl: %v %s", err, out)
	}
	text := strings.TrimSpace(string(out))
	answer, code := "", text
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		answer, code = text[:i], text[i+1:]
	}
	if code != "200" {
		return fmt.Errorf("HTTP %s: %s", code, answer)
	}
	return nil
}

// quietScrape scrapes every node's /metrics, one after another, at a
// moment no link probe (1 MiB each way every few seconds) ran between the
// first scrape and the last: it scrapes all nodes twice and keeps the
// second round when no node's QUIC byte counts moved by more than acks and
// keep-alives do in between. Comparing one node's count with its peer's
// from rounds a probe fell between read the probe's bytes on one side only
// (up to 10% of a direction's total here).
func (e *env) quietScrape(t *testing.T) map[*proc]promText {
	t.Helper()
	round := func() map[*proc]promText {
		out := map[*proc]promText{}
		for _, p := range e.nodes {
			out[p] = e.metrics(t, p)
		}
		return out
	}
	total := func(m promText) float64 {
		sum := 0.0
		for _, l := range m["shoal_peer_bytes_total"] {
			if strings.Contains(l, `source="quic"`) {
				f := strings.Fields(l)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				sum += v
			}
		}
		return sum
	}
	prev := round()
	for try := 0; ; try++ {
		now := round()
		moved := 0.0
		for _, p := range e.nodes {
			moved = max(moved, total(now[p])-total(prev[p]))
		}
		if moved < 64<<10 || try == 20 {
			if try == 20 {
				t.Logf("no quiet moment in 20 scrapes (last: a node's counts moved %.0f bytes); comparing the last", moved)
			}
			return now
		}
		prev = now
		time.Sleep(150 * time.Millisecond)
	}
}

// promText is a scrape of /metrics: metric lines by name.
type promText map[string][]string

func (e *env) metrics(t *testing.T, p *proc) promText {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", p.ns, "curl", "-sS", "--max-time", "20",
		"--cacert", filepath.Join(p.dir, "tls", "https-ca.pem"), "-H", "Authorization: Bearer "+secret, "https://"+p.ip+":7948/metrics").Output()
	if err != nil {
		t.Fatalf("metrics of %s: %v", p.name, err)
	}
	m := promText{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		name := l
		if i := strings.IndexAny(l, "{ "); i > 0 {
			name = l[:i]
		}
		m[name] = append(m[name], l)
	}
	return m
}

// value is the value of the first line of name carrying every label=value
// pair given (0 when none).
func (m promText) value(name string, kv ...string) float64 {
	for _, l := range m[name] {
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			if !strings.Contains(l, kv[i]+`="`+kv[i+1]+`"`) {
				ok = false
				break
			}
		}
		if ok {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v
		}
	}
	return 0
}

// label is the value of label key on the first line of name.
func (m promText) label(name, key string) string {
	for _, l := range m[name] {
		i := strings.Index(l, key+`="`)
		if i < 0 {
			continue
		}
		rest := l[i+len(key)+2:]
		if j := strings.IndexByte(rest, '"'); j >= 0 {
			return rest[:j]
		}
	}
	return ""
}
