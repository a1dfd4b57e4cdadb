package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Compile-time check against the engine's method set (engine/model is not
// imported: transport sits below the engine).
var _ interface {
	Rank() int
	Size() int
	AllReduceSum(x []float32) error
	AllGather(part []float32, out []float32) error
} = (*Group)(nil)

type testGroup struct {
	eps    []*Endpoint
	groups []*Group
}

func newTestGroup(t testing.TB, n int, cfg GroupConfig) *testGroup {
	t.Helper()
	ca, _ := DeriveCA(testSecret)
	var eps []*Endpoint
	for i := range n {
		ident, err := SelfIssue(ca, fmt.Sprintf("tp-%d", i), RoleServer)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := Listen(Config{Bind: "127.0.0.1:0", Identity: ident, HandshakeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		eps = append(eps, ep)
	}
	if cfg.ID == "" {
		cfg.ID = "tp"
	}
	return groupsOn(t, eps, cfg)
}

// groupsOn builds one group over the given endpoints, rank i on eps[i].
func groupsOn(t testing.TB, eps []*Endpoint, cfg GroupConfig) *testGroup {
	t.Helper()
	tg := &testGroup{eps: eps}
	var addrs []string
	for _, ep := range eps {
		addrs = append(addrs, ep.Addr().String())
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	for i, ep := range eps {
		c := cfg
		c.Members, c.Rank = addrs, i
		g, err := NewGroup(ep, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		tg.groups = append(tg.groups, g)
	}
	return tg
}

// each runs f for every member concurrently and returns their errors.
func (tg *testGroup) each(f func(r int, g *Group) error) []error {
	errs := make([]error, len(tg.groups))
	var wg sync.WaitGroup
	for r, g := range tg.groups {
		wg.Go(func() { errs[r] = f(r, g) })
	}
	wg.Wait()
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// rankOrderSum is what every member must compute with f32 on the wire:
// x0 + x1 + ... in float32.
func rankOrderSum(xs [][]float32) []float32 {
	sum := append([]float32(nil), xs[0]...)
	for _, x := range xs[1:] {
		addTo(sum, x)
	}
	return sum
}

// TestGroupAllReduceSum: every member ends with the same bits; with f32 on
// the wire they are the rank-order sum computed here, with f16 and q8_0
// they are within the encodings' error of the exact sum.
func TestGroupAllReduceSum(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, dt := range []DType{F32, F16, Q8_0} {
		for _, n := range []int{2, 3, 4} {
			// DirectMaxBytes 4 KiB: the longer vectors take reduce-scatter
			// + all-gather in groups of 3 and 4.
			tg := newTestGroup(t, n, GroupConfig{ID: "tp-" + dt.String(), DType: dt, DirectMaxBytes: 4 << 10})
			for _, size := range []int{1, 7, 100, 2048, 5000} {
				xs := make([][]float32, n)
				for i := range xs {
					xs[i] = randVec(r, size, 1)
				}
				outs := make([][]float32, n)
				noErrors(t, tg.each(func(r int, g *Group) error {
					outs[r] = append([]float32(nil), xs[r]...)
					return g.AllReduceSum(outs[r])
				}))
				for r := range outs {
					if !slicesEqualBits(outs[r], outs[0]) {
						t.Fatalf("%v, %d members, %d values: rank %d differs from rank 0", dt, n, size, r)
					}
				}
				if dt == F32 {
					if !slicesEqualBits(outs[0], rankOrderSum(xs)) {
						t.Fatalf("%d members, %d values: not the rank-order sum", n, size)
					}
					continue
				}
				// Per value: half an f16 ulp, or half a q8_0 step, for each
				// member's value and again for the reduced sum.
				tol := float32(n) * 2e-3
				if dt == Q8_0 {
					tol = float32(n) / 127 * 1.1
				}
				exact := rankOrderSum(xs)
				for i := range exact {
					if d := float32(math.Abs(float64(outs[0][i] - exact[i]))); d > tol {
						t.Fatalf("%v, %d members, %d values: [%d] %v vs exact %v", dt, n, size, i, outs[0][i], exact[i])
					}
				}
			}
		}
	}
}

func TestGroupAllGatherUnevenParts(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, n := range []int{2, 3, 4} {
		tg := newTestGroup(t, n, GroupConfig{})
		for round := range 3 {
			parts := make([][]float32, n)
			var want []float32
			for i := range parts {
				k := 3*i + 1 + round*100
				if i == 1 && round == 1 {
					k = 0 // an empty part
				}
				parts[i] = randVec(r, k, 5)
				want = append(want, parts[i]...)
			}
			outs := make([][]float32, n)
			noErrors(t, tg.each(func(r int, g *Group) error {
				outs[r] = make([]float32, len(want))
				return g.AllGather(parts[r], outs[r])
			}))
			for r := range outs {
				if !slicesEqualBits(outs[r], want) {
					t.Fatalf("%d members round %d: rank %d gathered wrong values", n, round, r)
				}
			}
		}
	}
}

func TestGroupAllGatherWrongOutLength(t *testing.T) {
	tg := newTestGroup(t, 2, GroupConfig{})
	errs := tg.each(func(r int, g *Group) error {
		return g.AllGather([]float32{1, 2}, make([]float32, 3))
	})
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d accepted out of 3 values for parts of 4", r)
		}
	}
}

func TestGroupManyConsecutiveCalls(t *testing.T) {
	tg := newTestGroup(t, 3, GroupConfig{DirectMaxBytes: 1 << 10})
	const calls = 150
	results := make([][]float32, 3)
	noErrors(t, tg.each(func(r int, g *Group) error {
		for c := range calls {
			size := 1 + c%7*97 // direct and reduce-scatter sizes alternate
			x := make([]float32, size)
			for i := range x {
				x[i] = float32(r*1000 + c)
			}
			if err := g.AllReduceSum(x); err != nil {
				return err
			}
			if want := float32(3*c + 3000); x[0] != want || x[size-1] != want {
				return fmt.Errorf("call %d: got %v, want %v", c, x[0], want)
			}
			out := make([]float32, 3)
			if err := g.AllGather([]float32{float32(c*10 + r)}, out); err != nil {
				return err
			}
			for i, v := range out {
				if v != float32(c*10+i) {
					return fmt.Errorf("all-gather %d: %v", c, out)
				}
			}
			results[r] = append(results[r], x[0])
		}
		return nil
	}))
}

func TestGroupMemberDiesMidCollective(t *testing.T) {
	const timeout = time.Second
	tg := newTestGroup(t, 3, GroupConfig{Timeout: timeout})
	for range 3 {
		noErrors(t, tg.each(func(r int, g *Group) error { return g.AllReduceSum(make([]float32, 64)) }))
	}
	// Ranks 0 and 1 enter the next all-reduce; rank 2 dies instead.
	start := time.Now()
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			errs[r] = tg.groups[r].AllReduceSum(make([]float32, 64))
			took[r] = time.Since(start)
		})
	}
	time.Sleep(100 * time.Millisecond)
	tg.eps[2].Close()
	wg.Wait()
	for r := range 2 {
		if errs[r] == nil {
			t.Fatalf("rank %d completed without rank 2", r)
		}
		if took[r] > 2*timeout {
			t.Fatalf("rank %d failed after %v, timeout %v", r, took[r], timeout)
		}
		if !strings.Contains(errs[r].Error(), "rank 2 ("+tg.eps[2].Addr().String()+")") {
			t.Fatalf("rank %d error does not name rank 2: %v", r, errs[r])
		}
		t.Logf("rank %d after %v: %v", r, took[r].Round(time.Millisecond), errs[r])
	}
	// The group stays failed.
	if err := tg.groups[0].AllReduceSum(make([]float32, 4)); err == nil || !strings.Contains(err.Error(), "unusable") {
		t.Fatalf("call after a failure: %v", err)
	}
	// The dead member's own group fails too.
	if err := tg.groups[2].AllReduceSum(make([]float32, 4)); err == nil {
		t.Fatal("call on a closed endpoint succeeded")
	}
}

func TestGroupSilentMemberTimesOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tg := newTestGroup(t, 2, GroupConfig{Timeout: timeout})
	start := time.Now()
	err := tg.groups[0].AllGather([]float32{1}, make([]float32, 2))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*timeout {
		t.Fatalf("got %v after %v", err, time.Since(start))
	}
	if !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("error does not name the silent rank: %v", err)
	}
}

func TestGroupCloseUnblocksCall(t *testing.T) {
	tg := newTestGroup(t, 2, GroupConfig{Timeout: 30 * time.Second})
	closeUnblocks(t, func() error { return tg.groups[0].AllReduceSum(make([]float32, 8)) }, tg.groups[0].Close)
	if err := tg.groups[0].AllReduceSum(make([]float32, 8)); err == nil {
		t.Fatal("call on a closed group succeeded")
	}
}

func TestGroupMemberJoinsLate(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	b := newEndpoint(t, ca, "b", RoleServer)
	members := []string{a.Addr().String(), b.Addr().String()}
	ga, err := NewGroup(a, GroupConfig{ID: "late", Members: members, Rank: 0, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Close()
	done := make(chan error, 1)
	x := []float32{1, 2}
	go func() { done <- ga.AllReduceSum(x) }()
	// b serves no collectives yet: a's stream is refused and retried.
	time.Sleep(300 * time.Millisecond)
	gb, err := NewGroup(b, GroupConfig{ID: "late", Members: members, Rank: 1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	y := []float32{10, 20}
	if err := gb.AllReduceSum(y); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if x[0] != 11 || x[1] != 22 || y[0] != 11 || y[1] != 22 {
		t.Fatalf("got %v and %v", x, y)
	}
	if _, err := NewGroup(b, GroupConfig{ID: "late", Members: members, Rank: 1}); err == nil {
		t.Fatal("a group id was reused on one endpoint")
	}
}

func TestGroupRefusesPeerFromAnotherCA(t *testing.T) {
	a, x := intruderPair(t)
	members := []string{a.Addr().String(), x.Addr().String()}
	ga, _ := NewGroup(a, GroupConfig{ID: "g", Members: members, Rank: 0, Timeout: time.Second})
	gx, _ := NewGroup(x, GroupConfig{ID: "g", Members: members, Rank: 1, Timeout: time.Second})
	defer ga.Close()
	defer gx.Close()
	va, vx := []float32{1}, []float32{100}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = ga.AllReduceSum(va) })
	wg.Go(func() { errs[1] = gx.AllReduceSum(vx) })
	wg.Wait()
	if errs[0] == nil || errs[1] == nil || va[0] != 1 || vx[0] != 100 {
		t.Fatalf("collective across CAs: %v / %v, values %v %v", errs[0], errs[1], va, vx)
	}
	t.Logf("member: %v", errs[0])
	t.Logf("intruder: %v", errs[1])
}

func TestGroupOfOne(t *testing.T) {
	tg := newTestGroup(t, 1, GroupConfig{})
	g := tg.groups[0]
	x := []float32{1, 2}
	if err := g.AllReduceSum(x); err != nil || x[0] != 1 || g.Size() != 1 || g.Rank() != 0 {
		t.Fatalf("%v %v", x, err)
	}
	out := make([]float32, 2)
	if err := g.AllGather(x, out); err != nil || out[1] != 2 {
		t.Fatalf("%v %v", out, err)
	}
}

// BenchmarkAllReduce: one all-reduce of 2 members on loopback, per call:
// 2,048 values in F32 and in F16 (issue #39's 4 KB payload), and a large
// vector, each over QUIC streams and over direct links (TCP).
func BenchmarkAllReduce(b *testing.B) {
	for _, c := range []struct {
		n    int
		dt   DType
		quic bool // collectives on QUIC streams, not direct links
	}{{2048, F32, true}, {2048, F32, false}, {2048, F16, true}, {2048, F16, false}, {2048 * 64, F32, true}, {2048 * 64, F32, false}} {
		n := c.n
		path := map[bool]string{false: "direct", true: "quic"}[c.quic]
		b.Run(fmt.Sprintf("members=2/floats=%d/%v/%s", n, c.dt, path), func(b *testing.B) {
			tg := newTestGroup(b, 2, GroupConfig{ID: fmt.Sprint("bench", n, c.dt, path), DType: c.dt, NoDirect: c.quic})
			x := [2][]float32{make([]float32, n), make([]float32, n)}
			b.SetBytes(int64(4 * n))
			lat := make([]time.Duration, b.N)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			errs := [2]error{}
			for r := range 2 {
				wg.Go(func() {
					for i := 0; i < b.N && errs[r] == nil; i++ {
						t0 := time.Now()
						errs[r] = tg.groups[r].AllReduceSum(x[r])
						if r == 0 {
							lat[i] = time.Since(t0)
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if errs[0] != nil || errs[1] != nil {
				b.Fatal(errs)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N), "µs/call")
			slices.Sort(lat)
			b.ReportMetric(float64(lat[b.N/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[b.N*99/100].Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(float64(tg.groups[0].Direct()), "direct-peers")
		})
	}
}
