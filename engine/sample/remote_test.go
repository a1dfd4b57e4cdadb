package sample

import (
	"encoding/json"
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
