package dashboard

import (
	"context"
	"slices"
	"strings"
)

// ModelTraffic is what an agent's OpenAI endpoint answered for one model
// since it started (or, summed, what the cluster's agents answered).
type ModelTraffic struct {
	Model           string  `json:"model"`
	Requests        uint64  `json:"requests"`
	Errors          uint64  `json:"errors"` // answered with a status of 400 or more
	PromptTokens    uint64  `json:"prompt_tokens"`
	GeneratedTokens uint64  `json:"generated_tokens"`
	TTFTMsSum       float64 `json:"ttft_ms_sum"` // over the requests with a first token
	TTFTCount       uint64  `json:"ttft_count"`
	InterTokenMsSum float64 `json:"inter_token_ms_sum"` // over every gap between two tokens
	InterTokenCount uint64  `json:"inter_token_count"`
}

// NodeTraffic is one agent's traffic by model.
type NodeTraffic struct {
	Node   string         `json:"node"`
	Models []ModelTraffic `json:"models"`
}

// ClusterTraffic is the traffic of the cluster's agents summed by model,
// with the agents that answered and those that did not (their requests
// are missing from the sums).
type ClusterTraffic struct {
	Models   []ModelTraffic `json:"models"`
	Answered []string       `json:"answered"`
	Missing  []string       `json:"missing,omitempty"`
}

// Peers lists the other agents' traffic for the cluster view: each
// agent's NodeTraffic, or, for one that could not be asked, its name in
// missing.
type Peers func(ctx context.Context) (got []NodeTraffic, missing []string)

// add counts one request's record into t.
func (t *ModelTraffic) add(r RequestRecord, gaps int) {
	t.Requests++
	if r.Status >= 400 {
		t.Errors++
	}
	t.PromptTokens += uint64(max(0, r.PromptTokens))
	t.GeneratedTokens += uint64(max(0, r.GeneratedTokens))
	if r.TTFTMs > 0 {
		t.TTFTMsSum += r.TTFTMs
		t.TTFTCount++
	}
	if gaps > 0 {
		t.InterTokenMsSum += r.MeanInterTokenMs * float64(gaps)
		t.InterTokenCount += uint64(gaps)
	}
}

// merge adds o's counts to t.
func (t *ModelTraffic) merge(o ModelTraffic) {
	t.Requests += o.Requests
	t.Errors += o.Errors
	t.PromptTokens += o.PromptTokens
	t.GeneratedTokens += o.GeneratedTokens
	t.TTFTMsSum += o.TTFTMsSum
	t.TTFTCount += o.TTFTCount
	t.InterTokenMsSum += o.InterTokenMsSum
	t.InterTokenCount += o.InterTokenCount
}

// Sum adds up the agents' traffic by model, the models in name order.
func Sum(nodes []NodeTraffic) ClusterTraffic {
	byModel := map[string]*ModelTraffic{}
	out := ClusterTraffic{Models: []ModelTraffic{}, Answered: []string{}}
	for _, n := range nodes {
		out.Answered = append(out.Answered, n.Node)
		for _, m := range n.Models {
			t := byModel[m.Model]
			if t == nil {
				t = &ModelTraffic{Model: m.Model}
				byModel[m.Model] = t
			}
			t.merge(m)
		}
	}
	for _, t := range byModel {
		out.Models = append(out.Models, *t)
	}
	slices.SortFunc(out.Models, func(a, b ModelTraffic) int { return strings.Compare(a.Model, b.Model) })
	slices.Sort(out.Answered)
	return out
}
