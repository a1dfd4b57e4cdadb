package sample

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRemoteDrawsLikeLocal samples a run of tokens twice with the same
// parameters and seed: once with Sample, once through Request, a JSON
// round trip, Remote on another sampler (as a remote node does) and
// Adopt. The tokens, log-probabilities and top lists must be the same,
// for greedy, every filter and the penalties; and a request without the
// generator's state draws differently (the test can fail).
func TestRemoteDrawsLikeLocal(t *testing.T) {
	const V, steps = 300, 40
	rng := rand.New(rand.NewPCG(7, 9))
	rows := make([][]float32, steps)
	for i := range rows {
		rows[i] = make([]float32, V)
		for j := range rows[i] {
			rows[i][j] = float32(rng.NormFloat64() * 2)
		}
	}
	for name, p := range map[string]Params{
		"greedy":       {},
		"dense":        {Temperature: 0.9, Seed: 5},
		"defaults":     func() Params { p := DefaultParams(); p.Seed = 11; return p }(),
		"top-k":        {Temperature: 1.2, TopK: 10, Seed: 3},
		"penalties":    {Temperature: 0.7, TopP: 0.9, RepeatPenalty: 1.3, RepeatLastN: 16, PresencePenalty: 0.5, FrequencyPenalty: 0.2, Seed: 8},
		"greedy+penal": {RepeatPenalty: 1.5, RepeatLastN: -1},
	} {
		t.Run(name, func(t *testing.T) {
			local, owner, remote := New(p, V), New(p, V), New(Params{}, V)
			var hl, hr []int32
			for i, row := range rows {
				want := local.Sample(row, hl)
				wlp, wtop := Logprobs(row, want, 3)
				req := owner.Request(hr, true, 3)
				b, err := json.Marshal(req)
				if err != nil {
					t.Fatal(err)
				}
				var wire Request
				if err := json.Unmarshal(b, &wire); err != nil {
					t.Fatal(err)
				}
				if remote.Params() != wire.Params {
					remote = New(wire.Params, V)
				}
				res, err := remote.Remote(&wire, row)
				if err != nil {
					t.Fatal(err)
				}
				if b, err = json.Marshal(res); err != nil {
					t.Fatal(err)
				}
				var back Result
				if err := json.Unmarshal(b, &back); err != nil {
					t.Fatal(err)
				}
				if err := owner.Adopt(&back); err != nil {
					t.Fatal(err)
				}
				if back.Token != want || back.Logprob != wlp || !slices.Equal(back.Top, wtop) {
					t.Fatalf("step %d: remote %d (%v %v), local %d (%v %v)", i, back.Token, back.Logprob, back.Top, want, wlp, wtop)
				}
				hl, hr = append(hl, want), append(hr, back.Token)
			}
		})
	}
	// Without the owner's state the remote draws from its own.
	p := Params{Temperature: 1, Seed: 5}
	local, remote := New(p, V), New(Params{Temperature: 1, Seed: 6}, V)
	same := 0
	for _, row := range rows {
		req := Request{Params: p}
		res, err := remote.Remote(&req, row)
		if err != nil {
			t.Fatal(err)
		}
		if res.Token == local.Sample(row, nil) {
			same++
		}
	}
	if same == steps {
		t.Fatal("a remote sampler with another seed drew every token the same")
	}
}

// TestSampleAllowed: a draw restricted to a token set takes only tokens of
// the set, and is exactly the draw Sample makes from logits whose other
// tokens are -Inf (the constrained distribution), for greedy, every filter
// and the penalties; a Request carrying the set through JSON draws the
// same tokens elsewhere.
func TestSampleAllowed(t *testing.T) {
	const V, steps = 300, 60
	rng := rand.New(rand.NewPCG(3, 4))
	for name, p := range map[string]Params{
		"greedy":    {},
		"dense":     {Temperature: 1, Seed: 5},
		"defaults":  func() Params { p := DefaultParams(); p.Seed = 11; return p }(),
		"top-k":     {Temperature: 1.2, TopK: 10, Seed: 3},
		"penalties": {Temperature: 0.7, TopP: 0.9, RepeatPenalty: 1.3, RepeatLastN: 16, PresencePenalty: 0.5, Seed: 8},
	} {
		t.Run(name, func(t *testing.T) {
			masked, ref, owner, remote := New(p, V), New(p, V), New(p, V), New(p, V)
			var hist []int32
			for i := range steps {
				row := make([]float32, V)
				for j := range row {
					row[j] = float32(rng.NormFloat64() * 3)
				}
				allow := make(Bits, (V+63)/64)
				minus := slices.Clone(row)
				for j := range V {
					// Sparse sets sometimes (a JSON punctuation state), dense others.
					if (i%3 == 0 && rng.IntN(50) == 0) || (i%3 != 0 && rng.IntN(4) != 0) {
						allow[j/64] |= 1 << (j % 64)
					} else {
						minus[j] = float32(math.Inf(-1))
					}
				}
				if i%3 == 0 {
					allow[0] |= 1 << 7 // never empty
					minus[7] = row[7]
				}
				got := masked.SampleAllowed(row, hist, allow)
				if allow[got/64]&(1<<(got%64)) == 0 {
					t.Fatalf("step %d: token %d is not allowed", i, got)
				}
				if want := ref.Sample(minus, hist); got != want {
					t.Fatalf("step %d: SampleAllowed %d, Sample over the masked logits %d", i, got, want)
				}
				req := owner.Request(hist, false, 0)
				req.Allow = allow
				b, err := json.Marshal(req)
				if err != nil {
					t.Fatal(err)
				}
				var wire Request
				if err := json.Unmarshal(b, &wire); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(wire.Allow, allow) {
					t.Fatal("the allowed set changed through JSON")
				}
				res, err := remote.Remote(&wire, row)
				if err != nil {
					t.Fatal(err)
				}
				if err := owner.Adopt(&res); err != nil {
					t.Fatal(err)
				}
				if res.Token != got {
					t.Fatalf("step %d: remote draw %d, local %d", i, res.Token, got)
				}
				hist = append(hist, got)
			}
		})
	}
	var b Bits
	if err := json.Unmarshal([]byte(`"AAEC"`), &b); err == nil {
		t.Fatal("a bitset of 3 bytes was accepted")
	}
}

// TestRemoteRowsChained: rows chained by After draw what a local sampler
// drawing them one after another draws (penalties over the drafted
// tokens, the generator's state carried), through a JSON round trip of
// the requests; a chain stops at the first row that did not draw its
// draft, the rows after it not drawn (Token -1).
func TestRemoteRowsChained(t *testing.T) {
	const V, k = 200, 6
	rng := rand.New(rand.NewPCG(3, 5))
	rows := make([][]float32, k+1)
	for i := range rows {
		rows[i] = make([]float32, V)
		for j := range rows[i] {
			rows[i][j] = float32(rng.NormFloat64())
		}
	}
	p := Params{Temperature: 1, RepeatPenalty: 1.8, RepeatLastN: 4, PresencePenalty: 1, Seed: 21}
	hist := []int32{5, 6, 7}
	// Locally, one row after another: the drafts are what it draws.
	local := New(p, V)
	h := slices.Clone(hist)
	var want []int32
	for i := range rows {
		tok := local.Sample(rows[i], h)
		want = append(want, tok)
		h = append(h, tok)
	}
	for _, wrongAt := range []int{-1, 2} {
		drafts := slices.Clone(want[:k])
		if wrongAt >= 0 {
			drafts[wrongAt] = (drafts[wrongAt] + 1) % V
		}
		owner := New(p, V)
		reqs := []Request{owner.Request(hist, false, 0)}
		for j := range drafts {
			reqs = append(reqs, Request{Params: p, After: &drafts[j]})
		}
		b, err := json.Marshal(reqs)
		if err != nil {
			t.Fatal(err)
		}
		var wire []Request
		if err := json.Unmarshal(b, &wire); err != nil {
			t.Fatal(err)
		}
		out := make([]Result, len(wire))
		remote := map[Params]*Sampler{}
		err = RemoteRows(wire, func(i int) []float32 { return rows[i] }, func(p Params) *Sampler {
			if remote[p] == nil {
				remote[p] = New(p, V)
			}
			return remote[p]
		}, out)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			switch {
			case wrongAt < 0 || i <= wrongAt:
				if r.Token != want[i] {
					t.Fatalf("draft %d wrong at %d: row %d drew %d, locally %d", wrongAt, wrongAt, i, r.Token, want[i])
				}
			default:
				if r.Token != -1 {
					t.Fatalf("row %d after the draft rejected at %d was drawn (%d)", i, wrongAt, r.Token)
				}
			}
		}
	}
}
