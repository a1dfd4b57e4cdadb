//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The agents' default ports.
const (
	wireGossipPort = 7946 // memberlist, TCP and UDP
	wireQUICPort   = 7947 // node transport, UDP
	wireHTTPPort   = 7948 // API (OpenAI endpoint, cluster API), TCP
)

// TestNoCleartextOnTheWire is issue #20's "no secret in clear on the
// wire": a server serving a tiny model and a client agent that joined with
// a join token, both bound to their network addresses with the default
// HTTP settings, and a client machine (a third namespace, no agent) that
// uses the admin CLI and the OpenAI endpoint of both agents. Every frame
// crossing the bridge that joins them is captured (an AF_PACKET socket in
// the bridge's namespace: all ports, TCP and UDP, both directions) from
// before the server starts to the end. Neither the raw frames nor the
// reassembled TCP streams may hold the bootstrap secret, the admin key,
// the join token's secret, the inference key, the prompt or the
// completion text, nor any plain HTTP. A plain-HTTP exchange made on
// purpose (a positive control: a request whose marker is split over two
// TCP segments, and its answer) must be found, and the capture must hold
// traffic on the API and the QUIC port, also between the client agent and
// the server while the client agent answered, so the test cannot pass by
// seeing nothing. On agents that serve plain HTTP the test says so and
// goes on in plain HTTP, showing what crosses in clear.
func TestNoCleartextOnTheWire(t *testing.T) {
	e := setup(t, 3)
	server, client, box := e.nodes[0], e.nodes[1], e.nodes[2]
	server.name, client.name, box.name = "s0", "c1", "box"
	t0 := time.Now()

	model := filepath.Join(e.dir, "tiny.gguf")
	if out, err := exec.Command(e.bin, "gen-model", "--arch", "llama", "--type", "q8_0", "--n-embd", "64", "--n-layer", "2",
		"--n-head", "4", "--n-ff", "128", "--vocab-size", "512", "--ctx", "256", "-q", "--out", model).CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, out)
	}
	w := &wireTest{env: e, t: t, server: server, client: client, box: box, model: "tiny"}
	// A bootstrap secret of this test's own, so that it is unique on the wire.
	boot := "boot-" + wireRandom(t, 28)
	w.key = boot

	capt, err := startWireCapture(e.bridge, 96<<20, 150*time.Second)
	if err != nil {
		t.Skipf("cannot capture on the bridge (AF_PACKET socket in namespace %s): %v", e.bridge, err)
	}
	t.Cleanup(capt.stop)

	server.args = []string{"agent", "--server", "--bootstrap-expect", "1", "--name", server.name, "--data-dir", server.dir,
		"--bind", server.ip, "--token", boot, "--model", model, "--threads", "1", "--log-level", "info"}
	e.start(server)
	w.probeAPI(server, 30*time.Second)
	w.waitLeader(30 * time.Second)

	// The operator's credentials, made with the CLI from the client
	// machine. Once an admin key exists the bootstrap secret is no API key.
	admin := w.createToken("--kind", "admin", "--description", "operator")
	w.key = admin.Secret
	join := w.createToken("--description", "client join token")
	inference := w.createToken("--kind", "inference", "--description", "app")

	client.args = []string{"agent", "--name", client.name, "--data-dir", client.dir, "--bind", client.ip,
		"--token", join.Secret, "--join", server.ip, "--threads", "1", "--log-level", "info"}
	e.start(client)
	w.probeAPI(client, 30*time.Second)
	w.waitServing(client, inference.Secret, 60*time.Second)
	t.Logf("cluster up in %v: server %s (%s) serves %q, client agent %s (%s) joined with a join token, API %s",
		time.Since(t0).Round(time.Millisecond), server.name, server.ip, w.model, client.name, client.ip, w.scheme)

	// The requests whose content must not be readable on the wire: a
	// prompt with a marker of its own, to each agent (through the client
	// agent it is forwarded to the server over the node transport),
	// streaming and not.
	marker := "mk" + wireRandom(t, 22)
	var completions [][]byte // raw JSON-encoded completion text, as sent by the agents
	chatsFrom := capt.count()
	for _, p := range []*proc{client, server} {
		var raw []byte
		var text string
		for try := 0; try < 5 && len(raw) < 16; try++ { // a random model may end early
			raw, text = w.chat(p, inference.Secret, marker, false)
		}
		if len(raw) < 16 {
			t.Fatalf("completion via %s is %d bytes (%q): too short to look for on the wire", p.name, len(raw), text)
		}
		completions = append(completions, raw)
		t.Logf("completion via %s: %d bytes of text", p.name, len(text))
		events, text := w.chat(p, inference.Secret, marker, true)
		if len(text) == 0 || len(events) == 0 {
			t.Fatalf("streamed completion via %s: no text", p.name)
		}
		completions = append(completions, events)
		t.Logf("streamed completion via %s: %d bytes of text", p.name, len(text))
	}
	chatsTo := capt.count()
	// And one more CLI call with the admin key after the traffic above.
	if _, err := w.shoal(w.key, "token", "ls"); err != nil {
		t.Fatal(err)
	}

	// The positive control: a request and its answer in plain HTTP on
	// purpose, between the client machine and the server's address (a
	// listener of the test's own, on a port of the kernel's choosing), the
	// request's marker split over two TCP segments.
	control, controlReply := "ctl"+wireRandom(t, 21), "rep"+wireRandom(t, 21)
	w.plainControl(server, control, controlReply)

	time.Sleep(300 * time.Millisecond) // the last frames reach the socket
	capt.stop()
	frames, truncated, capErr := capt.result()
	if capErr != nil {
		t.Fatalf("capture: %v", capErr)
	}
	if truncated {
		t.Fatalf("the capture hit its size bound (%d frames): raise it, a secret could hide in what was not captured", len(frames))
	}
	a := analyzeWire(frames)
	t.Logf("captured %d frames, %d bytes, %d TCP flows in %v; packets by port: %s",
		len(frames), a.bytes, len(a.streams), time.Since(t0).Round(time.Millisecond), a.portSummary())

	// The capture saw what it had to see.
	if len(frames) == 0 || a.bytes == 0 {
		t.Fatal("the capture is empty")
	}
	if a.ports["tcp/7948"] == 0 {
		t.Error("no packet on the API port (TCP 7948) in the capture: the check would prove nothing")
	}
	if a.ports["udp/7947"] == 0 {
		t.Error("no packet on the QUIC port (UDP 7947) in the capture: the check would prove nothing")
	}
	if n := a.pairs[wirePair(client.ip, server.ip, "udp", wireQUICPort)]; n == 0 {
		t.Errorf("no QUIC packet between the client agent %s and the server %s: the forwarded requests were not seen", client.ip, server.ip)
	} else {
		t.Logf("QUIC packets between the client agent and the server: %d", n)
	}
	// The client agent serves no model: its answers came from the server
	// over the node transport, in the frames captured during the chats.
	if n := analyzeWire(frames[chatsFrom:chatsTo]).pairs[wirePair(client.ip, server.ip, "udp", wireQUICPort)]; n == 0 {
		t.Errorf("no QUIC packet between the client agent and the server while the client agent answered: the agent-to-agent path was not seen")
	} else {
		t.Logf("QUIC packets between the client agent and the server during the chats: %d", n)
	}
	ctl := a.find([]byte(control), nil)
	if ctl.streams == 0 {
		t.Fatalf("the positive control's marker, sent in plain HTTP, is not in the capture: the checker is blind (raw %d, streams %d)", ctl.raw, ctl.streams)
	}
	t.Logf("positive control: the plain-HTTP request's marker found in %d reassembled stream(s) (%s), in %d raw frame(s) (split over two segments)",
		ctl.streams, strings.Join(ctl.where, ", "), ctl.raw)
	rep := a.find([]byte(controlReply), nil)
	if rep.raw == 0 || rep.streams == 0 {
		t.Fatalf("the positive control's answer, sent in plain HTTP, is not in the capture: the checker is blind (raw %d, streams %d)", rep.raw, rep.streams)
	}
	t.Logf("positive control: the plain-HTTP answer's marker found in %d raw frame(s), %d stream(s) (%s)", rep.raw, rep.streams, strings.Join(rep.where, ", "))

	// Nothing secret in clear.
	apiSecret := func(k string) string { // ID.secret: the secret part
		if i := strings.Index(k, "."); i >= 0 {
			return k[i+1:]
		}
		return k
	}
	joinParts := strings.Split(join.Secret, ".")
	if len(joinParts) < 2 || len(joinParts[1]) < 8 {
		t.Fatalf("join token %q is not ID.secret.cahash", join.Secret)
	}
	needles := []struct {
		what string
		b    []byte
	}{
		{"the bootstrap secret", []byte(boot)},
		{"the admin key", []byte(admin.Secret)},
		{"the admin key's secret", []byte(apiSecret(admin.Secret))},
		{"the join token", []byte(join.Secret)},
		{"the join token's secret", []byte(joinParts[1])},
		{"the inference key", []byte(inference.Secret)},
		{"the inference key's secret", []byte(apiSecret(inference.Secret))},
		{"the prompt marker", []byte(marker)},
	}
	for i, c := range completions {
		chunk := wireChunk(c, 24)
		what := "a chunk of the completion text"
		if i%2 == 1 {
			what = "a chunk of a streamed completion event" // the longest event line: its text and random id
		}
		needles = append(needles, struct {
			what string
			b    []byte
		}{fmt.Sprintf("%s (%q)", what, chunk), chunk})
	}
	clean := true
	for _, n := range needles {
		f := a.find(n.b, nil) // the deliberate plain-HTTP flows too: they carry no secret
		if f.raw > 0 || f.streams > 0 {
			clean = false
			t.Errorf("%s is in clear on the wire: in %d raw frame(s), %d TCP stream(s): %s", n.what, f.raw, f.streams, strings.Join(f.where, ", "))
		}
	}
	var plain []string
	for _, s := range a.streams {
		if w.plainFlows[s.key] {
			continue
		}
		if line, ok := plainHTTP(s.data); ok {
			plain = append(plain, fmt.Sprintf("%s: %q", s.key, line))
		}
	}
	if len(plain) > 0 {
		clean = false
		n := len(plain)
		sort.SliceStable(plain, func(i, j int) bool { // requests first
			return !strings.Contains(plain[i], `"HTTP/1.`) && strings.Contains(plain[j], `"HTTP/1.`)
		})
		if n > 6 {
			plain = append(plain[:6], fmt.Sprintf("and %d more", n-6))
		}
		t.Errorf("plain HTTP on the wire in %d TCP stream(s):\n%s", n, strings.Join(plain, "\n"))
	}
	if clean {
		t.Logf("no secret, prompt or completion in clear in %d frames (%d bytes): %d needles checked", len(frames), a.bytes, len(needles))
	}
	t.Logf("total %v", time.Since(t0).Round(time.Millisecond))
}

// wireTest is the cluster TestNoCleartextOnTheWire watches.
type wireTest struct {
	*env
	t              *testing.T
	server, client *proc
	box            *proc // the client machine: CLI calls and API requests
	model          string
	key            string // the admin key (the bootstrap secret at first)

	scheme string // https, or http when the agents do not serve HTTPS
	caPath string
	httpc  *http.Client
	// plainFlows are the TCP flows (both directions) of the requests sent
	// in plain HTTP on purpose, with no secret: the API probes and the
	// positive control.
	mu         sync.Mutex
	plainFlows map[string]bool
}

// wireRandom is n random letters and digits.
func wireRandom(t *testing.T, n int) string {
	const alphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	b := make([]byte, n)
	for i := range b {
		v, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			t.Fatal(err)
		}
		b[i] = alphabet[v.Int64()]
	}
	return string(b)
}

// inNetns runs f on an OS thread of its own moved into the network
// namespace ns; the thread ends with f (it is never unlocked), so no other
// goroutine runs in that namespace. Sockets f opens stay in ns.
func inNetns(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(filepath.Join("/run/netns", ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// boxDial dials from the client machine's namespace.
func (w *wireTest) boxDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(w.box.ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// plainDial dials from the client machine a connection for a request
// sent in plain HTTP on purpose, and notes its flows.
func (w *wireTest) plainDial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := w.boxDial(ctx, network, addr)
	if err == nil {
		w.mu.Lock()
		if w.plainFlows == nil {
			w.plainFlows = map[string]bool{}
		}
		l, r := c.LocalAddr().String(), c.RemoteAddr().String()
		w.plainFlows[l+" > "+r+" tcp"], w.plainFlows[r+" > "+l+" tcp"] = true, true
		w.mu.Unlock()
	}
	return c, err
}

// findHTTPSCA is the cluster's HTTPS CA certificate in an agent's data dir:
// tls/https-ca.pem, else another tls/*ca*.pem that is neither the node CA
// (ca.pem, Ed25519, the node transport's) nor a key.
func findHTTPSCA(dir string) string {
	p := filepath.Join(dir, "tls", "https-ca.pem")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	m, _ := filepath.Glob(filepath.Join(dir, "tls", "*ca*.pem"))
	sort.Strings(m)
	for _, f := range m {
		if base := filepath.Base(f); base != "ca.pem" && !strings.Contains(base, "key") {
			return f
		}
	}
	return ""
}

// probeAPI waits until p's API answers from the client machine and sets
// the scheme: https trusting the cluster's HTTPS CA from the server's data
// dir, or, when the agent answers plain HTTP on its network address, an
// error (the test goes on in plain HTTP so the capture shows what leaks).
func (w *wireTest) probeAPI(p *proc, timeout time.Duration) {
	w.t.Helper()
	url := fmt.Sprintf("://%s:%d/v1/health", p.ip, wireHTTPPort)
	plain := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: w.plainDial, DisableKeepAlives: true}}
	var last string
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if w.caPath == "" {
			w.caPath = findHTTPSCA(w.server.dir)
		}
		if w.caPath != "" && w.httpc == nil {
			pem, err := os.ReadFile(w.caPath)
			pool := x509.NewCertPool()
			if err == nil && pool.AppendCertsFromPEM(pem) {
				w.httpc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: w.boxDial,
					TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
			}
		}
		if w.httpc != nil {
			resp, err := w.httpc.Get("https" + url)
			if err == nil {
				resp.Body.Close()
				if w.scheme == "" {
					w.scheme = "https"
					w.t.Logf("%s's API speaks HTTPS; the client trusts the cluster's HTTPS CA %s", p.name, filepath.Base(w.caPath))
				} else if w.scheme != "https" {
					w.t.Fatalf("%s speaks HTTPS, another agent did not", p.name)
				}
				return
			}
			last = "https: " + err.Error()
		}
		resp, err := plain.Get("http" + url)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				w.t.Errorf("%s binds %s, a network address, and its API answers plain HTTP (http://%s:%d, no HTTPS CA file under %s): keys, prompts and completions cross the network in clear; the test goes on in plain HTTP to show it",
					p.name, p.ip, p.ip, wireHTTPPort, filepath.Join(w.server.dir, "tls"))
				if w.scheme == "https" {
					w.t.Fatalf("%s speaks plain HTTP, another agent HTTPS", p.name)
				}
				w.scheme, w.caPath = "http", ""
				w.httpc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: w.boxDial}}
				return
			}
			last = fmt.Sprintf("http: %d %s", resp.StatusCode, bytes.TrimSpace(b))
		} else if last == "" {
			last = "http: " + err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.t.Fatalf("%s's API did not answer within %v (HTTPS CA file %q): %s", p.name, timeout, w.caPath, last)
}

// shoal runs a CLI command on the client machine against the server.
func (w *wireTest) shoal(key string, args ...string) (string, error) {
	env := []string{"SHOAL_ADDR=" + fmt.Sprintf("%s://%s:%d", w.scheme, w.server.ip, wireHTTPPort), "SHOAL_TOKEN=" + key}
	if w.caPath != "" {
		env = append(env, "SHOAL_CACERT="+w.caPath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", w.box.ns, w.bin}, append(args, "-o", "json")...)...)
	c.Env = append(os.Environ(), env...)
	c.WaitDelay = 2 * time.Second
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.String(), fmt.Errorf("shoal %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// wireToken is what token create prints.
type wireToken struct {
	ID     string `json:"id"`
	Secret string `json:"token"`
}

func (w *wireTest) createToken(args ...string) wireToken {
	w.t.Helper()
	out, err := w.shoal(w.key, append([]string{"token", "create"}, args...)...)
	if err != nil {
		w.t.Fatal(err)
	}
	var tok wireToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.Secret == "" {
		w.t.Fatalf("token create: %v %q", err, out)
	}
	return tok
}

func (w *wireTest) waitLeader(timeout time.Duration) {
	w.t.Helper()
	var last string
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		out, err := w.shoal(w.key, "status")
		var s status
		if err == nil && json.Unmarshal([]byte(out), &s) == nil && s.Leader != "" {
			return
		}
		last = fmt.Sprint(err, out)
		time.Sleep(200 * time.Millisecond)
	}
	w.t.Fatalf("no leader after %v: %s", timeout, last)
}

// post sends an OpenAI request to p's API from the client machine.
func (w *wireTest) post(p *proc, key, body string) (*http.Response, error) {
	req, err := http.NewRequest("POST", fmt.Sprintf("%s://%s:%d/v1/chat/completions", w.scheme, p.ip, wireHTTPPort), strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return w.httpc.Do(req)
}

// waitServing waits until the model answers through p.
func (w *wireTest) waitServing(p *proc, key string, timeout time.Duration) {
	w.t.Helper()
	body := `{"model":"` + w.model + `","messages":[{"role":"user","content":"Hello"}],"max_tokens":2}`
	var last string
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		resp, err := w.post(p, key, body)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(300 * time.Millisecond)
	}
	w.t.Fatalf("model not served through %s after %v: %s", p.name, timeout, last)
}

// chat asks p for a completion of a prompt holding marker. It returns the
// bytes to look for on the wire (the JSON-encoded completion text as the
// agent sent it; streamed, the longest event line) and the text.
func (w *wireTest) chat(p *proc, key, marker string, stream bool) (raw []byte, text string) {
	w.t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Please repeat %s"}],"max_tokens":32,"stream":%v}`, w.model, marker, stream)
	resp, err := w.post(p, key, body)
	if err != nil {
		w.t.Fatalf("chat via %s: %v", p.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		w.t.Fatalf("chat via %s: %d %s", p.name, resp.StatusCode, b)
	}
	if !stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			w.t.Fatalf("chat via %s: %v", p.name, err)
		}
		var r struct {
			Choices []struct {
				Message struct {
					Content json.RawMessage `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
			w.t.Fatalf("chat via %s: %v %s", p.name, err, b)
		}
		raw = bytes.Trim(r.Choices[0].Message.Content, `"`)
		_ = json.Unmarshal(r.Choices[0].Message.Content, &text)
		return raw, text
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for i := 0; sc.Scan() && i < 10000; i++ {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok || bytes.Equal(line, []byte("[DONE]")) {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(line, &ev) != nil {
			w.t.Fatalf("streamed chat via %s: event %q", p.name, line)
		}
		for _, c := range ev.Choices {
			text += c.Delta.Content
		}
		if len(line) > len(raw) {
			raw = append([]byte(nil), line...)
		}
	}
	return raw, text
}

// wireChunk picks up to n bytes of b that are the least common: the
// window with the most distinct bytes (no spaces or a common word filling
// it).
func wireChunk(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	best, bestScore := 0, -1
	for i := 0; i+n <= len(b); i++ {
		seen := map[byte]bool{}
		for _, c := range b[i : i+n] {
			seen[c] = true
		}
		if len(seen) > bestScore {
			best, bestScore = i, len(seen)
		}
	}
	return b[best : best+n]
}

// plainControl serves one plain-HTTP request on p's address (a listener
// of the test's own in p's namespace) and sends it from the client
// machine: the request holds marker, split over two TCP segments, the
// answer reply.
func (w *wireTest) plainControl(p *proc, marker, reply string) {
	w.t.Helper()
	var ln net.Listener
	if err := inNetns(p.ns, func() error {
		var err error
		ln, err = net.Listen("tcp", p.ip+":0")
		return err
	}); err != nil {
		w.t.Fatalf("positive control: %v", err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			served <- err
			return
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 4096))
		if err != nil || !bytes.Contains(body, []byte(marker)) {
			served <- fmt.Errorf("the listener read %q, %v", body, err)
			return
		}
		_, err = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(reply), reply)
		served <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := w.plainDial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		w.t.Fatalf("positive control: %v", err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetNoDelay(true)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	half := len(marker) / 2
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", ln.Addr(), len(marker)+2)
	if _, err := c.Write([]byte(head + `"` + marker[:half])); err != nil {
		w.t.Fatalf("positive control: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := c.Write([]byte(marker[half:] + `"`)); err != nil {
		w.t.Fatalf("positive control: %v", err)
	}
	b, _ := io.ReadAll(io.LimitReader(c, 4096))
	if err := <-served; err != nil {
		w.t.Fatalf("positive control: %v", err)
	}
	if !bytes.Contains(b, []byte(reply)) {
		w.t.Fatalf("positive control: answer %q", b)
	}
	w.t.Logf("positive control: a plain-HTTP exchange with %s: %q", ln.Addr(), firstLine(b))
}

func firstLine(b []byte) string {
	if i := bytes.IndexAny(b, "\r\n"); i >= 0 {
		b = b[:i]
	}
	if len(b) > 120 {
		b = b[:120]
	}
	return string(b)
}

// plainHTTP reports whether a TCP stream starts as HTTP/1 in clear.
func plainHTTP(b []byte) (string, bool) {
	for _, p := range []string{"GET ", "POST ", "PUT ", "DELETE ", "HEAD ", "PATCH ", "OPTIONS ", "HTTP/1."} {
		if bytes.HasPrefix(b, []byte(p)) {
			return firstLine(b), true
		}
	}
	return "", false
}

// wireCapture reads every frame of a network namespace from an AF_PACKET
// socket, within a byte and a time bound.
type wireCapture struct {
	fd        int
	done      chan struct{}
	stopOnce  sync.Once
	stopping  chan struct{}
	mu        sync.Mutex
	frames    [][]byte
	truncated bool
	err       error
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// startWireCapture opens the socket in ns and reads until stop, maxBytes
// or maxTime.
func startWireCapture(ns string, maxBytes int, maxTime time.Duration) (*wireCapture, error) {
	c := &wireCapture{fd: -1, done: make(chan struct{}), stopping: make(chan struct{})}
	err := inNetns(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		return nil, err
	}
	_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(c.fd)
		return nil, err
	}
	go c.read(maxBytes, time.Now().Add(maxTime))
	return c, nil
}

func (c *wireCapture) read(maxBytes int, deadline time.Time) {
	defer close(c.done)
	defer unix.Close(c.fd)
	buf := make([]byte, 1<<18)
	total := 0
	for time.Now().Before(deadline) {
		select {
		case <-c.stopping:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		// Each frame is seen leaving one bridge port as well as entering
		// another: keep the copy entering.
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		c.mu.Lock()
		if total+n > maxBytes {
			c.truncated = true
			c.mu.Unlock()
			return
		}
		total += n
		c.frames = append(c.frames, append([]byte(nil), buf[:n]...))
		c.mu.Unlock()
	}
}

func (c *wireCapture) stop() {
	c.stopOnce.Do(func() { close(c.stopping) })
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
	}
}

// count is the number of frames captured so far.
func (c *wireCapture) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.frames)
}

func (c *wireCapture) result() ([][]byte, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames, c.truncated, c.err
}

// wireAnalysis is what the frames hold: packets per port and per address
// pair, and each TCP flow's payload in sequence order.
type wireAnalysis struct {
	frames  [][]byte
	bytes   int
	ports   map[string]int // "tcp/7948": packets to or from the port
	pairs   map[string]int // wirePair
	streams []wireStream
}

type wireStream struct {
	key  string // "10.77.0.3:40000 > 10.77.0.1:7948 tcp"
	data []byte
}

// wirePair names the packets between two addresses on a port of theirs.
func wirePair(a, b, proto string, port int) string {
	if a > b {
		a, b = b, a
	}
	return fmt.Sprintf("%s %s<->%s:%d", proto, a, b, port)
}

type wireSegment struct {
	seq     uint32
	payload []byte
}

func analyzeWire(frames [][]byte) *wireAnalysis {
	a := &wireAnalysis{frames: frames, ports: map[string]int{}, pairs: map[string]int{}}
	flows := map[string][]wireSegment{}
	known := map[int]bool{wireGossipPort: true, wireQUICPort: true, wireHTTPPort: true}
	for _, f := range frames {
		a.bytes += len(f)
		if len(f) < 14 {
			continue
		}
		etype, ip := binary.BigEndian.Uint16(f[12:14]), f[14:]
		if etype == 0x8100 && len(f) >= 18 {
			etype, ip = binary.BigEndian.Uint16(f[16:18]), f[18:]
		}
		if etype != 0x0800 || len(ip) < 20 || ip[0]>>4 != 4 {
			a.ports["other"]++
			continue
		}
		ihl := int(ip[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if tot > len(ip) || tot < ihl { // offloaded frames may carry 0 or more than the frame
			tot = len(ip)
		}
		src, dst := net.IP(ip[12:16]).String(), net.IP(ip[16:20]).String()
		proto, l4 := ip[9], ip[ihl:tot]
		var name string
		switch proto {
		case 6:
			name = "tcp"
		case 17:
			name = "udp"
		default:
			a.ports[fmt.Sprintf("ip/%d", proto)]++
			continue
		}
		if len(l4) < 8 {
			continue
		}
		sp, dp := int(binary.BigEndian.Uint16(l4[0:2])), int(binary.BigEndian.Uint16(l4[2:4]))
		for _, port := range []int{sp, dp} {
			if known[port] {
				a.ports[fmt.Sprintf("%s/%d", name, port)]++
				a.pairs[wirePair(src, dst, name, port)]++
				break
			}
		}
		if !known[sp] && !known[dp] {
			a.ports[name+"/other"]++
		}
		if proto != 6 || len(l4) < 20 {
			continue
		}
		off := int(l4[12]>>4) * 4
		if off < 20 || off > len(l4) {
			continue
		}
		key := fmt.Sprintf("%s:%d > %s:%d tcp", src, sp, dst, dp)
		seq := binary.BigEndian.Uint32(l4[4:8])
		if l4[13]&0x02 != 0 { // SYN takes a sequence number
			seq++
		}
		if len(l4) > off {
			flows[key] = append(flows[key], wireSegment{seq: seq, payload: l4[off:]})
		} else if _, ok := flows[key]; !ok {
			flows[key] = nil
		}
	}
	keys := make([]string, 0, len(flows))
	for k := range flows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		a.streams = append(a.streams, wireStream{key: k, data: reassemble(flows[k])})
	}
	return a
}

// reassemble puts a flow's segments in sequence order, once each
// (retransmissions and copies overlap); a gap becomes a zero byte.
func reassemble(segs []wireSegment) []byte {
	if len(segs) == 0 {
		return nil
	}
	base := segs[0].seq
	for _, s := range segs {
		if int32(s.seq-base) < 0 {
			base = s.seq
		}
	}
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].seq-base < segs[j].seq-base })
	var out []byte
	end := int64(0)
	for _, s := range segs {
		off := int64(s.seq - base)
		if off > end {
			out = append(out, 0)
			end = off
		}
		if skip := end - off; skip < int64(len(s.payload)) {
			out = append(out, s.payload[skip:]...)
			end = off + int64(len(s.payload))
		}
	}
	return out
}

type wireFound struct {
	raw, streams int
	where        []string
}

// find counts the frames and the TCP streams (but those in skip) holding
// b.
func (a *wireAnalysis) find(b []byte, skip map[string]bool) wireFound {
	var f wireFound
	if len(b) == 0 {
		return f
	}
	for _, fr := range a.frames {
		if bytes.Contains(fr, b) {
			f.raw++
		}
	}
	for _, s := range a.streams {
		if skip[s.key] {
			continue
		}
		if n := bytes.Count(s.data, b); n > 0 {
			f.streams++
			f.where = append(f.where, fmt.Sprintf("%s (%d times)", s.key, n))
		}
	}
	return f
}

func (a *wireAnalysis) portSummary() string {
	keys := make([]string, 0, len(a.ports))
	for k := range a.ports {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, a.ports[k]))
	}
	return strings.Join(parts, ", ")
}
