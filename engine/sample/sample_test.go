package sample

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// randLogits returns n logits drawn from N(0, scale²) with a fixed seed.
func randLogits(n int, scale float64, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// params returns sampling params with every filter off at temperature t.
func params(t float32) Params {
	return Params{Temperature: t, RepeatPenalty: 1}
}

// refPenalize applies llama.cpp's penalty formulas naively.
func refPenalize(p Params, logits []float32, history []int32) []float32 {
	x := slices.Clone(logits)
	if p.RepeatLastN == 0 {
		return x
	}
	win := history
	if p.RepeatLastN > 0 && len(win) > p.RepeatLastN {
		win = win[len(win)-p.RepeatLastN:]
	}
	count := map[int32]int{}
	for _, t := range win {
		if t >= 0 && int(t) < len(x) {
			count[t]++
		}
	}
	for t, c := range count {
		if p.RepeatPenalty != 0 && p.RepeatPenalty != 1 {
			if x[t] <= 0 {
				x[t] *= p.RepeatPenalty
			} else {
				x[t] /= p.RepeatPenalty
			}
		}
		x[t] -= float32(float32(c)*p.FrequencyPenalty) + p.PresencePenalty
	}
	return x
}

// refKept is a straightforward full-sort implementation of the filter chain
// (penalties → top-k → top-p → min-p); it returns the kept ids, ascending.
func refKept(p Params, logits []float32, history []int32) []int32 {
	x := refPenalize(p, logits, history)
	type tc struct {
		id int32
		l  float32
	}
	var c []tc
	for i, v := range x {
		if !math.IsNaN(float64(v)) {
			c = append(c, tc{int32(i), v})
		}
	}
	slices.SortStableFunc(c, func(a, b tc) int { // stable: ties keep ascending id
		switch {
		case a.l > b.l:
			return -1
		case a.l < b.l:
			return 1
		}
		return 0
	})
	if p.TopK > 0 && p.TopK < len(c) {
		c = c[:p.TopK]
	}
	maxv := c[0].l
	if p.TopP > 0 && p.TopP < 1 {
		var z float64
		for _, t := range c {
			z += math.Exp(float64(t.l - maxv))
		}
		var cum float64
		for i, t := range c {
			cum += math.Exp(float64(t.l - maxv))
			if cum >= float64(p.TopP)*z {
				c = c[:i+1]
				break
			}
		}
	}
	if p.MinP > 0 {
		m := 1
		for m < len(c) && math.Exp(float64(c[m].l-maxv)) >= float64(p.MinP) {
			m++
		}
		c = c[:m]
	}
	ids := make([]int32, len(c))
	for i, t := range c {
		ids[i] = t.id
	}
	slices.Sort(ids)
	return ids
}

// kept runs the Sampler's own filter chain and returns the kept ids, ascending.
func kept(s *Sampler, logits []float32, history []int32) []int32 {
	s.grow(len(logits))
	var ids []int32
	for _, c := range s.filter(s.penalize(logits, history)) {
		ids = append(ids, keyID(c))
	}
	slices.Sort(ids)
	return ids
}

func TestDefaultParams(t *testing.T) {
	p := DefaultParams()
	want := Params{Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1, RepeatLastN: 64}
	if p != want {
		t.Fatalf("DefaultParams() = %+v, want %+v", p, want)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("DefaultParams().Validate() = %v", err)
	}
}

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	good := []Params{
		{},
		DefaultParams(),
		{Temperature: 0, TopP: 1, MinP: 1, RepeatPenalty: 0, RepeatLastN: -1},
		{Temperature: 2, TopK: 1, TopP: 0.5, PresencePenalty: -0.5, FrequencyPenalty: 1.5, RepeatPenalty: 1.3},
	}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", p, err)
		}
	}
	bad := []struct {
		name string
		edit func(*Params)
		want string
	}{
		{"negative temperature", func(p *Params) { p.Temperature = -0.1 }, "temperature"},
		{"NaN temperature", func(p *Params) { p.Temperature = nan }, "temperature"},
		{"Inf temperature", func(p *Params) { p.Temperature = inf }, "temperature"},
		{"negative top-k", func(p *Params) { p.TopK = -1 }, "top-k"},
		{"top-p above 1", func(p *Params) { p.TopP = 1.01 }, "top-p"},
		{"negative top-p", func(p *Params) { p.TopP = -0.2 }, "top-p"},
		{"NaN top-p", func(p *Params) { p.TopP = nan }, "top-p"},
		{"min-p above 1", func(p *Params) { p.MinP = 1.5 }, "min-p"},
		{"negative min-p", func(p *Params) { p.MinP = -0.1 }, "min-p"},
		{"NaN min-p", func(p *Params) { p.MinP = nan }, "min-p"},
		{"negative repeat penalty", func(p *Params) { p.RepeatPenalty = -1 }, "repeat penalty"},
		{"NaN repeat penalty", func(p *Params) { p.RepeatPenalty = nan }, "repeat penalty"},
		{"last-n below -1", func(p *Params) { p.RepeatLastN = -2 }, "last-n"},
		{"NaN presence", func(p *Params) { p.PresencePenalty = nan }, "presence"},
		{"Inf frequency", func(p *Params) { p.FrequencyPenalty = -inf }, "frequency"},
	}
	for _, tc := range bad {
		p := DefaultParams()
		tc.edit(&p)
		err := p.Validate()
		if err == nil {
			t.Errorf("%s: Validate(%+v) = nil, want error", tc.name, p)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not mention %q", tc.name, err, tc.want)
		}
	}
	// Several problems are all reported.
	err := Params{Temperature: -1, TopP: 2, RepeatLastN: -5}.Validate()
	if err == nil || !strings.Contains(err.Error(), "temperature") ||
		!strings.Contains(err.Error(), "top-p") || !strings.Contains(err.Error(), "last-n") {
		t.Errorf("joined error = %v, want temperature, top-p and last-n", err)
	}
}

func TestGreedyPicksArgmax(t *testing.T) {
	// Greedy ignores the other filters: a tiny top-p / huge min-p must not
	// change anything, and nor may the seed.
	p := Params{Temperature: 0, TopK: 3, TopP: 0.1, MinP: 0.9, RepeatPenalty: 1, Seed: 7}
	for trial := range 50 {
		x := randLogits(1000, 3, uint64(trial))
		want := int32(0)
		for i, v := range x {
			if v > x[want] {
				want = int32(i)
			}
		}
		s := New(p, len(x))
		for range 3 {
			if got := s.Sample(x, nil); got != want {
				t.Fatalf("trial %d: greedy = %d, want argmax %d", trial, got, want)
			}
		}
	}
	// Ties go to the lowest id; NaN is never picked; +Inf wins.
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		logits []float32
		want   int32
	}{
		{[]float32{1, 3, 2, 3, 3}, 1},
		{[]float32{nan, 0.5, nan, 0.5}, 1},
		{[]float32{0, 1, inf, 2, inf}, 2},
		{[]float32{float32(math.Inf(-1)), float32(math.Inf(-1))}, 0},
	}
	for _, tc := range cases {
		if got := New(Params{}, len(tc.logits)).Sample(tc.logits, nil); got != tc.want {
			t.Errorf("greedy(%v) = %d, want %d", tc.logits, got, tc.want)
		}
	}
}

func TestTopK1EqualsGreedy(t *testing.T) {
	for _, temp := range []float32{0.01, 0.8, 5, 100} {
		p := Params{Temperature: temp, TopK: 1, TopP: 0.9, MinP: 0.01, RepeatPenalty: 1.2, RepeatLastN: 16, Seed: 3}
		g := p
		g.Temperature = 0
		s, gs := New(p, 500), New(g, 500)
		for trial := range 40 {
			x := randLogits(500, 2, uint64(100+trial))
			x[7], x[300] = 50, 50 // a tie at the top: lowest id must win
			if trial%2 == 1 {
				x[7], x[300] = 0, 0
			}
			hist := []int32{int32(trial), 7, 300, int32(2 * trial)}
			if got, want := s.Sample(x, hist), gs.Sample(x, hist); got != want {
				t.Fatalf("T=%v trial %d: top-k=1 gave %d, greedy %d", temp, trial, got, want)
			}
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	const n, steps = 2000, 1000
	x := randLogits(n, 1, 42)
	run := func(p Params) []int32 {
		s := New(p, n)
		hist := []int32{1, 2, 3}
		for range steps {
			hist = append(hist, s.Sample(x, hist))
		}
		return hist
	}
	for _, p := range []Params{
		DefaultParams(),
		{Temperature: 1.3, TopP: 0.9, RepeatPenalty: 1.1, RepeatLastN: 32, FrequencyPenalty: 0.1},
		{Temperature: 1, RepeatPenalty: 1},
	} {
		p.Seed = 12345
		a, b := run(p), run(p)
		if !slices.Equal(a, b) {
			t.Fatalf("%+v: same seed gave different sequences", p)
		}
		q := p
		q.Seed = 12346
		if c := run(q); slices.Equal(a, c) {
			t.Fatalf("%+v: seeds 12345 and 12346 gave the same %d tokens", p, steps)
		}
		distinct := map[int32]bool{}
		for _, v := range a[3:] {
			distinct[v] = true
		}
		if len(distinct) < 10 {
			t.Fatalf("%+v: only %d distinct tokens in %d draws; sampling looks degenerate", p, len(distinct), steps)
		}
	}

	// Reset(seed) restarts the exact sequence of a fresh sampler.
	p := DefaultParams()
	p.Seed = 9
	s := New(p, n)
	var first, second []int32
	for range 200 {
		first = append(first, s.Sample(x, nil))
	}
	s.Reset(9)
	for range 200 {
		second = append(second, s.Sample(x, nil))
	}
	if !slices.Equal(first, second) {
		t.Fatal("Reset(seed) did not reproduce the sequence")
	}
}

// TestSkipContinues: a sampler made with Skip set to another's Draws
// after some tokens draws exactly what that one draws next, through the
// draws a filter leaves out (one candidate: no draw) and greedy steps.
func TestSkipContinues(t *testing.T) {
	const n = 300
	x := randLogits(n, 1, 7)
	one := make([]uint64, (n+63)/64)
	one[0] = 1 << 5 // a mask that allows token 5 alone: no draw
	p := DefaultParams()
	p.Seed = 77
	a := New(p, n)
	var hist []int32
	for i := range 40 {
		var allow []uint64
		if i%7 == 3 {
			allow = one
		}
		hist = append(hist, a.SampleAllowed(x, hist, allow))
	}
	if d := a.Draws(); d == 0 || d >= 40 {
		t.Fatalf("draws after 40 tokens, 6 of them forced: %d", d)
	}
	q := p
	q.Skip = a.Draws()
	b := New(q, n)
	for i := range 100 {
		ta, tb := a.Sample(x, hist), b.Sample(x, hist)
		if ta != tb {
			t.Fatalf("token %d after the skip: %d, want %d", i, tb, ta)
		}
		hist = append(hist, ta)
	}
	if a.Draws() != b.Draws() {
		t.Fatalf("draws %d and %d", a.Draws(), b.Draws())
	}
	q.Skip = MaxSkip + 1
	if q.Validate() == nil {
		t.Fatal("a skip over MaxSkip validates")
	}
}

// chiSquareCritical approximates the chi-square quantile at 1-1e-3 for df
// degrees of freedom (Wilson–Hilferty).
func chiSquareCritical(df int) float64 {
	const z = 3.09
	d := float64(df)
	a := 2 / (9 * d)
	return d * math.Pow(1-a+z*math.Sqrt(a), 3)
}

func TestEmpiricalDistribution(t *testing.T) {
	const draws = 20000
	logits := []float32{1, 0.5, 0, -0.5, 2, -1, 0.25, 1.5}
	cases := []struct {
		name string
		p    Params
	}{
		{"plain T=0.7", params(0.7)},
		{"plain T=1", params(1)},
		{"top-k 3 T=1.5", Params{Temperature: 1.5, TopK: 3}},
		{"top-p 0.8", Params{Temperature: 1, TopP: 0.8}},
		{"min-p 0.2 T=2", Params{Temperature: 2, MinP: 0.2}},
		{"top-k 5 + top-p 0.9 + min-p 0.1", Params{Temperature: 0.9, TopK: 5, TopP: 0.9, MinP: 0.1}},
		{"defaults", DefaultParams()},
	}
	for _, tc := range cases {
		tc.p.Seed = 2024
		ids := refKept(tc.p, logits, nil)
		// Expected: softmax(logit/T) over the kept set.
		expect := make([]float64, len(logits))
		var z float64
		for _, id := range ids {
			expect[id] = math.Exp(float64(logits[id]) / float64(tc.p.Temperature))
			z += expect[id]
		}
		s := New(tc.p, len(logits))
		counts := make([]int, len(logits))
		for range draws {
			counts[s.Sample(logits, nil)]++
		}
		var chi float64
		for id := range logits {
			e := expect[id] / z * draws
			if e == 0 {
				if counts[id] != 0 {
					t.Errorf("%s: token %d was filtered out but drawn %d times", tc.name, id, counts[id])
				}
				continue
			}
			d := float64(counts[id]) - e
			chi += d * d / e
		}
		if df := len(ids) - 1; df > 0 {
			if crit := chiSquareCritical(df); chi > crit {
				t.Errorf("%s: chi-square %.2f > %.2f (df %d); counts %v, kept %v", tc.name, chi, crit, df, counts, ids)
			}
		}
	}
}

func TestTopPKeptSet(t *testing.T) {
	// Probabilities 0.5, 0.25, 0.15, 0.07, 0.03 placed at scrambled ids.
	perm := []int{3, 0, 4, 1, 2}
	probs := []float64{0.5, 0.25, 0.15, 0.07, 0.03}
	logits := make([]float32, 5)
	for r, id := range perm {
		logits[id] = float32(math.Log(probs[r]))
	}
	top := func(r int) []int32 { // ids of the r most likely tokens
		ids := make([]int32, r)
		for i := range r {
			ids[i] = int32(perm[i])
		}
		slices.Sort(ids)
		return ids
	}
	cases := []struct {
		topK int
		topP float32
		keep int
	}{
		{0, 0.4, 1}, {0, 0.7, 2}, {0, 0.8, 3}, {0, 0.95, 4}, {0, 0.99, 5},
		// Under top-k 4 the mass is renormalized over 0.97: 0.5/0.97 = 0.515,
		// 0.75/0.97 = 0.773, 0.9/0.97 = 0.928.
		{4, 0.5, 1}, {4, 0.52, 2}, {4, 0.77, 2}, {4, 0.78, 3}, {4, 0.93, 4}, {4, 0.999, 4},
	}
	for _, tc := range cases {
		p := Params{Temperature: 1, TopK: tc.topK, TopP: tc.topP, Seed: 1}
		s := New(p, len(logits))
		want := top(tc.keep)
		if got := kept(s, logits, nil); !slices.Equal(got, want) {
			t.Errorf("top-k %d top-p %v: kept %v, want %v", tc.topK, tc.topP, got, want)
		}
		seen := map[int32]bool{}
		for range 3000 {
			seen[s.Sample(logits, nil)] = true
		}
		for id := range seen {
			if !slices.Contains(want, id) {
				t.Errorf("top-k %d top-p %v: drew %d outside kept set %v", tc.topK, tc.topP, id, want)
			}
		}
		if len(seen) != len(want) {
			t.Errorf("top-k %d top-p %v: drew %d distinct tokens, kept set has %d", tc.topK, tc.topP, len(seen), len(want))
		}
	}

	// A larger vocabulary: three tokens with 0.4, 0.3, 0.2 and 997 tied tokens
	// sharing 0.1. Top-p 0.93 needs 0.03/(0.1/997) = 299.1 → 300 of the tied
	// tokens, which go in ascending id order.
	const n = 1000
	big := make([]float32, n)
	for i := range big {
		big[i] = float32(math.Log(0.1 / 997))
	}
	big[500], big[20], big[999] = float32(math.Log(0.4)), float32(math.Log(0.3)), float32(math.Log(0.2))
	want := []int32{20, 500, 999}
	for id := int32(0); len(want) < 303; id++ {
		if id != 20 && id != 500 {
			want = append(want, id)
		}
	}
	slices.Sort(want)
	for _, topP := range []float32{0.85, 0.93} {
		s := New(Params{Temperature: 1, TopP: topP}, n)
		w := want
		if topP == 0.85 {
			w = []int32{20, 500, 999}
		}
		if got := kept(s, big, nil); !slices.Equal(got, w) {
			t.Errorf("big vocab top-p %v: kept %d tokens %v..., want %d", topP, len(got), got[:min(len(got), 6)], len(w))
		}
	}
}

func TestMinP(t *testing.T) {
	// Ranked logits 0, -1, -2, -3, -4 at scrambled ids: p_i/p_max = e^-r.
	logits := []float32{-2, 0, -4, -1, -3}
	cases := []struct {
		minP float32
		want []int32
	}{
		{0.1, []int32{0, 1, 3}}, // e^-2 = 0.135 ≥ 0.1 > e^-3 = 0.050
		{0.3, []int32{1, 3}},    // e^-1 = 0.368 ≥ 0.3 > 0.135
		{0.4, []int32{1}},       // only the max
		{0.01, []int32{0, 1, 2, 3, 4}},
		{0.04, []int32{0, 1, 3, 4}}, // e^-3 = 0.0498 ≥ 0.04 > e^-4 = 0.018
	}
	for _, topK := range []int{0, 4} {
		for _, tc := range cases {
			want := tc.want
			if topK == 4 && len(want) == 5 {
				want = []int32{0, 1, 3, 4}
			}
			p := Params{Temperature: 3, TopK: topK, MinP: tc.minP, Seed: 5}
			s := New(p, len(logits))
			if got := kept(s, logits, nil); !slices.Equal(got, want) {
				t.Errorf("top-k %d min-p %v: kept %v, want %v", topK, tc.minP, got, want)
			}
			seen := map[int32]bool{}
			for range 3000 {
				seen[s.Sample(logits, nil)] = true
			}
			if len(seen) != len(want) {
				t.Errorf("top-k %d min-p %v: drew %v, kept set %v", topK, tc.minP, seen, want)
			}
			for id := range seen {
				if !slices.Contains(want, id) {
					t.Errorf("top-k %d min-p %v: drew dropped token %d", topK, tc.minP, id)
				}
			}
		}
	}
}

func TestPenaltiesChangeChoice(t *testing.T) {
	cases := []struct {
		name    string
		p       Params
		logits  []float32
		history []int32
		want    int32
	}{
		// Repeat penalty, positive logit: 3.0/1.1 = 2.73 < 2.9.
		{"repeat positive", Params{RepeatPenalty: 1.1, RepeatLastN: 64}, []float32{3.0, 2.9, 1}, []int32{0}, 1},
		{"repeat off", Params{RepeatPenalty: 1, RepeatLastN: 64}, []float32{3.0, 2.9, 1}, []int32{0}, 0},
		{"repeat zero is off", Params{RepeatPenalty: 0, RepeatLastN: 64}, []float32{3.0, 2.9, 1}, []int32{0}, 0},
		// Negative logit is multiplied (-1.1 < -1.05); dividing would give -0.91 and keep token 0.
		{"repeat negative", Params{RepeatPenalty: 1.1, RepeatLastN: 64}, []float32{-1.0, -1.05, -3}, []int32{0}, 1},
		// The repeat penalty does not depend on the count: 3.0/1.1 = 2.73 > 2.7.
		{"repeat ignores count", Params{RepeatPenalty: 1.1, RepeatLastN: 64}, []float32{3.0, 2.7}, []int32{0, 0, 0, 0}, 0},
		// Frequency: 5 - 3*0.4 = 3.8 < 4; once: 5 - 0.4 = 4.6 > 4.
		{"frequency x3", Params{FrequencyPenalty: 0.4, RepeatLastN: 64}, []float32{5, 4}, []int32{0, 0, 0}, 1},
		{"frequency x1", Params{FrequencyPenalty: 0.4, RepeatLastN: 64}, []float32{5, 4}, []int32{0}, 0},
		// Presence: counted once whatever the count: 5 - 0.9 = 4.1 > 4, 5 - 1.1 = 3.9 < 4.
		{"presence 0.9", Params{PresencePenalty: 0.9, RepeatLastN: 64}, []float32{5, 4}, []int32{0, 0, 0}, 0},
		{"presence 1.1", Params{PresencePenalty: 1.1, RepeatLastN: 64}, []float32{5, 4}, []int32{0}, 1},
		// Negative presence rewards a seen token.
		{"presence negative", Params{PresencePenalty: -1.5, RepeatLastN: 64}, []float32{4, 5}, []int32{0}, 0},
		// Window: the last token is 1, so only it is penalized: 5 vs 4-2 = 2.
		// With all history: 5-2*2 = 1 vs 2.
		{"window excludes", Params{FrequencyPenalty: 2, RepeatLastN: 1}, []float32{5, 4}, []int32{0, 0, 1}, 0},
		{"window all", Params{FrequencyPenalty: 2, RepeatLastN: -1}, []float32{5, 4}, []int32{0, 0, 1}, 1},
		{"window none", Params{FrequencyPenalty: 2, RepeatLastN: 0}, []float32{5, 4}, []int32{0, 0}, 0},
		// Out-of-vocabulary history ids are ignored.
		{"ignore bad ids", Params{FrequencyPenalty: 2, RepeatLastN: -1}, []float32{5, 4}, []int32{-1, 2, 1 << 30}, 0},
	}
	for _, tc := range cases {
		// Greedy, and also top-k 1 at a high temperature: both apply penalties.
		for _, mode := range []string{"greedy", "top-k 1"} {
			p := tc.p
			if mode == "top-k 1" {
				p.Temperature, p.TopK = 10, 1
			}
			if got := New(p, len(tc.logits)).Sample(tc.logits, tc.history); got != tc.want {
				t.Errorf("%s (%s): got %d, want %d", tc.name, mode, got, tc.want)
			}
		}
	}
}

func TestPenaltyValues(t *testing.T) {
	logits := []float32{2, -1, 0.5, 3, 0}
	history := []int32{0, 0, 1, 3, 3, 3, 99, -5}
	p := Params{RepeatPenalty: 1.25, PresencePenalty: 0.5, FrequencyPenalty: 0.25, RepeatLastN: -1}
	rp, pres, freq := p.RepeatPenalty, p.PresencePenalty, p.FrequencyPenalty
	// float32(...) around products: the same explicit rounding as the code.
	want := []float32{
		2/rp - (float32(2*freq) + pres),
		float32(-1*rp) - (float32(1*freq) + pres),
		0.5,
		3/rp - (float32(3*freq) + pres),
		0,
	}
	s := New(p, len(logits))
	for range 2 { // counts must be reset between calls
		if got := s.penalize(logits, history); !slices.Equal(got, want) {
			t.Fatalf("penalized = %v, want %v", got, want)
		}
	}
	if got := s.penalize(logits, history); !slices.Equal(got, refPenalize(p, logits, history)) {
		t.Fatalf("penalized = %v, reference %v", got, refPenalize(p, logits, history))
	}
	// Last 3 tokens are [3, 99, -5]: only token 3, once.
	p.RepeatLastN = 3
	want = []float32{2, -1, 0.5, 3/rp - (float32(1*freq) + pres), 0}
	if got := New(p, len(logits)).penalize(logits, history); !slices.Equal(got, want) {
		t.Fatalf("last-3 penalized = %v, want %v", got, want)
	}
}

func TestLogitsUnchanged(t *testing.T) {
	x := randLogits(3000, 2, 8)
	x[10] = float32(math.NaN())
	x[11] = float32(math.Inf(-1))
	orig := slices.Clone(x)
	hist := []int32{1, 2, 3, 3, 3, 10, 11, 2999}
	for _, p := range []Params{
		{RepeatPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.2, RepeatLastN: -1},
		{Temperature: 0.9, TopK: 40, TopP: 0.9, MinP: 0.05, RepeatPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.2, RepeatLastN: 64},
		{Temperature: 0.9, TopP: 0.9, RepeatPenalty: 0.8, FrequencyPenalty: 1, RepeatLastN: -1},
		{Temperature: 0.9, MinP: 0.1, PresencePenalty: 3, RepeatLastN: 4},
	} {
		s := New(p, len(x))
		for range 20 {
			s.Sample(x, hist)
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(orig[i]) {
				t.Fatalf("%+v: logits[%d] changed from %v to %v", p, i, orig[i], x[i])
			}
		}
	}
}

func TestFilterMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 0))
	for trial := range 300 {
		n := []int{1, 2, 7, 50, 1000, 5000}[trial%6]
		x := randLogits(n, []float64{0.3, 2, 8}[r.IntN(3)], uint64(trial))
		if trial%5 == 0 { // coarse values create ties
			for i := range x {
				x[i] = float32(math.Round(float64(x[i])*2) / 2)
			}
		}
		p := Params{
			Temperature:      1,
			TopK:             []int{0, 1, 5, 40, n + 3}[r.IntN(5)],
			TopP:             []float32{0, 0.3, 0.9, 0.99, 1}[r.IntN(5)],
			MinP:             []float32{0, 0.05, 0.3}[r.IntN(3)],
			RepeatPenalty:    []float32{1, 1.2, 0.9}[r.IntN(3)],
			RepeatLastN:      []int{0, 8, -1}[r.IntN(3)],
			PresencePenalty:  []float32{0, 0.5}[r.IntN(2)],
			FrequencyPenalty: []float32{0, 0.3}[r.IntN(2)],
		}
		hist := make([]int32, r.IntN(30))
		for i := range hist {
			hist[i] = int32(r.IntN(n))
		}
		s := New(p, n)
		got, want := kept(s, x, hist), refKept(p, x, hist)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d (n=%d, %+v): kept %d tokens, reference %d\n got %v\nwant %v",
				trial, n, p, len(got), len(want), got[:min(len(got), 20)], want[:min(len(want), 20)])
		}
	}
}

func TestDegenerateLogits(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, p := range []Params{params(1), {Temperature: 1, TopK: 2}, {Temperature: 1, TopP: 0.5}, {Temperature: 1, MinP: 0.1}} {
		check := func(x []float32, ok func(int32) bool) {
			s := New(p, len(x))
			for range 200 {
				if id := s.Sample(x, nil); !ok(id) {
					t.Fatalf("%+v: Sample(%v) = %d", p, x, id)
				}
			}
		}
		check([]float32{nan, 1, nan, 1, -inf}, func(id int32) bool { return id == 1 || id == 3 })
		check([]float32{1, inf, 2, inf}, func(id int32) bool { return id == 1 })
		check([]float32{-inf, -inf, -inf}, func(id int32) bool { return id == 0 })
		check([]float32{nan, nan, nan}, func(id int32) bool { return id == 0 })
		check([]float32{nan, -inf, -inf}, func(id int32) bool { return id == 0 })
		check([]float32{0, -inf, 0, -inf}, func(id int32) bool { return id == 0 || id == 2 })
	}
}

func TestSampleNoAllocs(t *testing.T) {
	cases := []struct {
		name string
		n    int
		p    Params
	}{
		{"defaults", 32000, DefaultParams()},
		{"greedy + penalties", 32000, Params{RepeatPenalty: 1.1, FrequencyPenalty: 0.1, RepeatLastN: 64}},
		{"top-p full vocab", 150000, Params{Temperature: 0.7, TopP: 0.9, RepeatPenalty: 1.1, RepeatLastN: -1}},
		{"min-p only", 32000, Params{Temperature: 1, MinP: 0.05}},
		{"no filters", 32000, params(1)},
	}
	for _, tc := range cases {
		x := randLogits(tc.n, 3, 1)
		hist := make([]int32, 200)
		for i := range hist {
			hist[i] = int32(i * 7 % tc.n)
		}
		s := New(tc.p, tc.n)
		s.Sample(x, hist)
		if a := testing.AllocsPerRun(20, func() { s.Sample(x, hist) }); a != 0 {
			t.Errorf("%s: %v allocs per Sample, want 0", tc.name, a)
		}
	}
}

func BenchmarkSample(b *testing.B) {
	const n = 32000
	x := randLogits(n, 3, 1)
	hist := make([]int32, 64)
	for i := range hist {
		hist[i] = int32(i * 499 % n)
	}
	s := New(DefaultParams(), n)
	b.ReportAllocs()
	for b.Loop() {
		s.Sample(x, hist)
	}
}

func BenchmarkSampleModes(b *testing.B) {
	cases := []struct {
		name string
		n    int
		p    Params
	}{
		{"greedy+penalties/32k", 32000, Params{RepeatPenalty: 1.1, RepeatLastN: 64}},
		{"defaults/150k", 150000, DefaultParams()},
		{"top-p0.95/150k", 150000, Params{Temperature: 0.8, TopP: 0.95, MinP: 0.05}},
		{"top-p0.95-no-min-p/150k", 150000, Params{Temperature: 0.8, TopP: 0.95}},
		{"no-filters/150k", 150000, params(1)},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			x := randLogits(tc.n, 3, 1)
			s := New(tc.p, tc.n)
			b.ReportAllocs()
			for b.Loop() {
				s.Sample(x, nil)
			}
		})
	}
}

func TestExpNeg(t *testing.T) {
	var worst float64
	for i := range 1_000_000 {
		d := float64(i) * 707.9 / 1_000_000
		want := math.Exp(-d)
		worst = max(worst, math.Abs(expNeg(d)-want)/want)
	}
	if worst > 1e-9 {
		t.Errorf("expNeg worst relative error %g, want < 1e-9", worst)
	}
	for _, d := range []float64{708, 1e6, math.Inf(1), math.NaN()} {
		if got := expNeg(d); got != 0 {
			t.Errorf("expNeg(%v) = %v, want 0", d, got)
		}
	}
	if got := expNeg(0); got != 1 {
		t.Errorf("expNeg(0) = %v, want 1", got)
	}
}

func TestKeyOrder(t *testing.T) {
	inf := float32(math.Inf(1))
	vals := []float32{-inf, -1e30, -2.5, -1, -1e-40, 0, 1e-40, 1, 2.5, 1e30, inf}
	var keys []uint64
	for _, v := range vals {
		for _, id := range []int{0, 7, 1 << 20} {
			k := key(id, v)
			if keyID(k) != int32(id) || keyLogit(k) != v {
				t.Fatalf("key(%d, %v) decodes to (%d, %v)", id, v, keyID(k), keyLogit(k))
			}
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for i := 1; i < len(keys); i++ {
		a, b := keys[i-1], keys[i]
		if keyLogit(a) < keyLogit(b) || (keyLogit(a) == keyLogit(b) && keyID(a) > keyID(b)) {
			t.Fatalf("keys out of rank order: (%d, %v) before (%d, %v)", keyID(a), keyLogit(a), keyID(b), keyLogit(b))
		}
	}
}
