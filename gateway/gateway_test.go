package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shoal/api/openai"
	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/gateway"
	"shoal/serve"
	"shoal/transport"
	"shoal/transport/transporttest"
)

const secret = "gateway-test-secret-0123456789"

// endpoint is a node's transport endpoint on loopback, closed when the
// test ends.
func endpoint(t *testing.T, ca *transport.CA, id string) *transport.Endpoint {
	t.Helper()
	ep := transporttest.Listen(t, ca, id)
	t.Cleanup(func() { ep.Close() })
	return ep
}

// writeModel writes the small real model the drivers serve.
func writeModel(t *testing.T) string {
	return enginetest.Write(t, "", synth.Spec{Arch: "llama", NEmbd: 128, NLayer: 2, NHead: 4, NHeadKV: 2, NFF: 256, Type: "q8_0", Seed: 1, Name: "x"})
}

// paced is a driver's Submitter that records the prompt length of each
// submission and passes each event on after a pause (so that a driver
// closed mid-stream has not sent the rest already).
type paced struct {
	openai.Submitter
	prompts chan int
	stall   *stall
}

// stall pauses a driver: while on, its generations send nothing more (as
// a driver stopped with SIGSTOP or cut off by a partition) until the
// test ends.
type stall struct {
	on      atomic.Bool
	release chan struct{}
}

func (p paced) Submit(ctx context.Context, req openai.Request) (openai.Stream, error) {
	select {
	case p.prompts <- len(req.Prompt):
	default:
	}
	st, err := p.Submitter.Submit(ctx, req)
	return pacedStream{st, p.stall}, err
}

type pacedStream struct {
	openai.Stream
	stall *stall
}

func (p pacedStream) Next() (openai.Event, error) {
	time.Sleep(5 * time.Millisecond)
	if p.stall.on.Load() {
		<-p.stall.release
	}
	return p.Stream.Next()
}

// driver serves model "x" from path through the gateway on a fresh
// endpoint; prompts receives the prompt length of each generation it
// runs. It never stops at an end-of-generation token, so that every run
// generates max_tokens.
func driver(t *testing.T, ca *transport.CA, id, path string) (*transport.Endpoint, chan int) {
	t.Helper()
	ep, prompts, _ := stallingDriver(t, ca, id, path)
	return ep, prompts
}

// stallingDriver is driver with its stall switch.
func stallingDriver(t *testing.T, ca *transport.CA, id, path string) (*transport.Endpoint, chan int, *stall) {
	t.Helper()
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: 512})
	if err != nil {
		t.Fatal(err)
	}
	s, err := serve.New(r, func(int32) bool { return false }, serve.Options{})
	if err != nil {
		t.Fatal(err)
	}
	om := gateway.NewOpenAIModel("x", id, s, tok, "")
	prompts := make(chan int, 16)
	st := &stall{release: make(chan struct{})}
	t.Cleanup(func() { close(st.release) })
	om.Submitter = paced{om.Submitter, prompts, st}
	served, err := gateway.NewServed(om, m.File)
	if err != nil {
		t.Fatal(err)
	}
	ep := endpoint(t, ca, id)
	t.Cleanup(func() { ep.Close(); s.Close(); r.Close() })
	gateway.Serve(ep, func(name string) (gateway.Served, bool) { return served, name == "x" })
	return ep, prompts, st
}

// route is a switchable route to one driver.
type route struct {
	mu sync.Mutex
	to gateway.Target
}

func (r *route) set(ep *transport.Endpoint) {
	r.mu.Lock()
	r.to = gateway.Target{Addr: ep.Addr().String(), Node: ep.Identity().ID, Name: ep.Identity().ID}
	r.mu.Unlock()
}

func (r *route) get(string) (gateway.Target, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.to, r.to.Addr != ""
}

// front is the client of an agent that drives nothing; a generation is
// sent again after at most two losses, each time for at most 3 s.
func front(t *testing.T, ca *transport.CA, rt *route) *gateway.Client {
	return gateway.NewClient(gateway.Config{Endpoint: endpoint(t, ca, "front"), Route: rt.get, Local: gateway.OpenAIVocab,
		Resubmits: 2, MigrateWithin: 3 * time.Second, Backoff: 50 * time.Millisecond, RouteCheck: 100 * time.Millisecond,
		DialTimeout: 2 * time.Second})
}

var prompt = []int32{1, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100}

// remote is model x at a front whose route names driver a.
func remote(t *testing.T, ca *transport.CA, a *transport.Endpoint) (*route, *openai.Model) {
	t.Helper()
	rt := &route{}
	rt.set(a)
	m, err := front(t, ca, rt).Model(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	return rt, m
}

// generate runs a greedy request of n tokens on m; after cutAt tokens (if
// > 0) it calls cut. It returns the tokens and the final event.
func generate(t *testing.T, m *openai.Model, n, cutAt int, cut func()) ([]int32, openai.Event) {
	t.Helper()
	return generateWith(t, m, nil, 0, n, cutAt, cut)
}

// generateWith is generate held to the GBNF grammar gbnf (nil: free),
// sampled at temperature temp (0: greedy) with seed 7.
func generateWith(t *testing.T, m *openai.Model, gbnf *string, temp float32, n, cutAt int, cut func()) ([]int32, openai.Event) {
	t.Helper()
	req := openai.Request{Prompt: prompt, MaxTokens: n, Sampling: openai.Sampling{Temperature: temp, Seed: 7}}
	if gbnf != nil {
		c, err := m.Constrainer.Grammar(*gbnf, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Constraint = c
	}
	st, err := m.Submitter.Submit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Cancel()
	var toks []int32
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("after %d tokens: %v", len(toks), err)
		}
		if ev.Done {
			return toks, ev
		}
		toks = append(toks, ev.Token)
		if len(toks) == cutAt {
			cut()
		}
	}
}

func text(m *openai.Model, toks []int32) string {
	d := m.Tokenizer.NewDecoder()
	var b strings.Builder
	for _, id := range toks {
		b.WriteString(d.Add(id))
	}
	return b.String() + d.Flush()
}

// TestResubmitAfterCut: a generation (greedy, constrained, or sampled
// with a seed) whose driver is lost after a few tokens is sent again, with
// the tokens it has and the sampler's draw count, to another driver of the
// same model; the text is the text of an uncut run.
func TestResubmitAfterCut(t *testing.T) {
	ca, err := transport.DeriveCA(secret)
	if err != nil {
		t.Fatal(err)
	}
	path := writeModel(t)
	a, _ := driver(t, ca, "driver-a", path)
	b, atB := driver(t, ca, "driver-b", path)
	rt, m := remote(t, ca, a)
	for _, c := range []struct {
		name string
		gbnf *string
		temp float32
	}{{"free", nil, 0}, {"constrained", &lowercase, 0}, {"sampled", nil, 1}} {
		if a == nil { // the last run lost a: b drives, a fresh driver stands by
			fresh, atFresh := driver(t, ca, "driver-"+c.name, path)
			a, b, atB = b, fresh, atFresh
			rt.set(a)
		}
		t.Run(c.name, func(t *testing.T) { resubmitAfterCut(t, rt, m, a, b, atB, c.gbnf, c.temp) })
		a = nil
	}
}

// lowercase is a grammar that allows only lowercase words.
var lowercase = `root ::= [a-z]+ (" " [a-z]+)*`

// resubmitAfterCut runs a greedy generation on a, then the same cut after
// a few tokens, with b taking over; the texts must be the same.
func resubmitAfterCut(t *testing.T, rt *route, m *openai.Model, a, b *transport.Endpoint, atB chan int, gbnf *string, temp float32) {
	const n, cutAt = 24, 6
	whole, end := generateWith(t, m, gbnf, temp, n, 0, nil)
	if len(whole) != n || end.Reason != "length" || end.Generated != n {
		t.Fatalf("uncut run: %d tokens, end %+v", len(whole), end)
	}
	cutRun, end := generateWith(t, m, gbnf, temp, n, cutAt, func() {
		rt.set(b)
		a.Close() // driver a goes away mid-stream
	})
	if end.Reason != "length" || end.Generated != n {
		t.Errorf("cut run ended %+v, want length after %d", end, n)
	}
	var carried int
	select {
	case p := <-atB:
		carried = p - len(prompt)
	default:
		t.Fatal("driver b was never asked: the cut did not cut")
	}
	if carried < cutAt || carried >= n {
		t.Errorf("driver b continued after %d tokens; the front had read %d when driver a went away", carried, cutAt)
	}
	got, want := text(m, cutRun), text(m, whole)
	t.Logf("driver a lost after the front read %d of %d tokens; driver b continued after %d; uncut %q; resubmitted %q", cutAt, n, carried, want, got)
	if got != want || len(cutRun) != len(whole) {
		t.Fatalf("the resubmitted run differs:\n got %q (%d tokens)\nwant %q (%d tokens)", got, len(cutRun), want, len(whole))
	}
}

// TestStalledDriverMoves: a driver that stops sending mid-generation
// (paused, or cut off) holds its generation only until the route names
// another driver; the generation moves there from the tokens it has and
// its text is the text of an undisturbed run.
func TestStalledDriverMoves(t *testing.T) {
	ca, err := transport.DeriveCA(secret)
	if err != nil {
		t.Fatal(err)
	}
	path := writeModel(t)
	a, _, stalled := stallingDriver(t, ca, "driver-a", path)
	b, atB := driver(t, ca, "driver-b", path)
	rt, m := remote(t, ca, a)
	const n, cutAt = 24, 6
	whole, _ := generate(t, m, n, 0, nil)
	var moved time.Time
	got, end := generate(t, m, n, cutAt, func() {
		stalled.on.Store(true)
		time.Sleep(300 * time.Millisecond) // the front waits on a silent driver
		moved = time.Now()
		rt.set(b)
	})
	t.Logf("driver a stalled after %d tokens; the route named b; the generation ended %v later", cutAt, time.Since(moved).Round(time.Millisecond))
	select {
	case <-atB:
	default:
		t.Fatal("driver b was never asked: the generation stayed on the stalled driver")
	}
	if end.Reason != "length" || text(m, got) != text(m, whole) {
		t.Fatalf("moved run: end %+v\n got %q\nwant %q", end, text(m, got), text(m, whole))
	}
}

// TestLostForGood: with no driver left, a cut generation ends with an
// error after its resubmissions, not a hang.
func TestLostForGood(t *testing.T) {
	ca, _ := transport.DeriveCA(secret)
	a, _ := driver(t, ca, "driver-a", writeModel(t))
	_, m := remote(t, ca, a)
	st, err := m.Submitter.Submit(context.Background(), openai.Request{Prompt: prompt, MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Cancel()
	if _, err := st.Next(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	for i := 0; ; i++ {
		ev, err := st.Next()
		if err != nil {
			if !strings.Contains(err.Error(), "resubmissions failed") {
				t.Errorf("error: %v", err)
			}
			return
		}
		if ev.Done || i > 100 {
			t.Fatalf("the generation went on without its driver: %+v", ev)
		}
	}
}

// TestUnknownModel: a model the driver does not drive is a clear 404.
func TestUnknownModel(t *testing.T) {
	ca, _ := transport.DeriveCA(secret)
	a, _ := driver(t, ca, "driver-a", writeModel(t))
	var rt route
	rt.set(a)
	_, err := front(t, ca, &rt).Model(context.Background(), "nosuch")
	var ge *gateway.Error
	if !errors.As(err, &ge) || ge.HTTPStatus() != http.StatusNotFound || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("unknown model: %v", err)
	}
}
