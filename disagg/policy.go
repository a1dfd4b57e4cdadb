package disagg

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Mode says whether requests may be prefilled by the prefill pool.
type Mode int

// Modes. The zero Mode is ModeAuto.
const (
	ModeAuto Mode = iota // remote when the cost model says it pays
	ModeOn               // every request with uncached tokens prefills remotely
	ModeOff              // every request prefills where it decodes
)

// modeNames are the modes' names, by mode.
var modeNames = [...]string{ModeAuto: "auto", ModeOn: "on", ModeOff: "off"}

// String is the mode's name, as ParseMode takes it.
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "auto", "on" or "off" (as String gives them).
func ParseMode(s string) (Mode, error) {
	if m := slices.Index(modeNames[:], s); m >= 0 {
		return Mode(m), nil
	}
	return 0, fmt.Errorf("disagg: mode %q: want auto, on or off", s)
}

// Policy defaults, used where a CostModel leaves Margin or MinUncached zero.
const (
	// DefaultMargin: a remote prefill must save a fifth of the local time,
	// to cover what the model leaves out (queueing at the prefill pool,
	// scheduling the import, a stream to open) and so that a near tie, which
	// measurement noise can tip either way, stays local.
	DefaultMargin = 0.2
	// DefaultMinUncached is the floor under the break-even: fewer uncached
	// tokens always prefill locally. Dynamo and TensorRT-LLM use about a
	// thousand; below that a prefill is short wherever it runs and the
	// fixed costs the model leaves out dominate.
	DefaultMinUncached = 1000
)

// CostModel is what Decide weighs: the KV cache size, the two prefill
// rates and the link between the pools. Rates and link figures come from
// measurements (the plan's predictions, probes, live counters).
type CostModel struct {
	// KVBytesPerToken is the KV cache one token takes over every layer and
	// KV head, K and V (2·layers·kvHeads·headDim·2 bytes in F16).
	KVBytesPerToken int
	// Layers is the number of layers the KV streams in (one after the
	// other as prefill produces them); 0 or 1 models no overlap at all.
	Layers int
	// LocalPrefillTokPerSec is the prefill rate where the request decodes.
	LocalPrefillTokPerSec float64
	// RemotePrefillTokPerSec is the prefill pool's rate.
	RemotePrefillTokPerSec float64
	// LinkGbit is the bandwidth a transfer gets between the pools, in
	// Gbit/s (summed over the member links it uses in parallel).
	LinkGbit float64
	// LinkLatencyMs is the round trip between the pools: the request out,
	// the last layer's KV back.
	LinkLatencyMs float64
	// Margin is the fraction of the local prefill time a remote prefill must
	// save, in [0,1) (DefaultMargin if 0).
	Margin float64
	// MinUncached is the floor under the break-even, in tokens
	// (DefaultMinUncached if 0).
	MinUncached int
	// Isolation, when positive, weighs sparing the decode pool over
	// speed: a prompt the decode pool prefills stalls every stream it
	// runs for as long, so a remote prefill pays when moving the KV costs
	// the margin less than computing it there (transfer per token at most
	// (1-Margin) of the local compute per token) and the prompt's own
	// remote time is at most (1+Isolation·(1+Streams)) times the local
	// one. Zero keeps the speed rule: remote only when it saves the margin.
	Isolation float64
	// Streams is the sequences the decode pool is running now, which a
	// local prefill would stall for as long as it runs: each one weighs
	// as much as the prompt itself in the isolation bound (a busy decode
	// pool sends a long prompt away unless that is much slower; an idle
	// one only when it is at most Isolation slower).
	Streams int
}

// isolation is the fraction by which a remote prefill may be slower than
// a local one and still be chosen (Isolation, weighed by Streams).
func (cm CostModel) isolation() float64 {
	return cm.Isolation * float64(1+max(cm.Streams, 0))
}

// Check says what is missing or wrong in cm, nil if Decide can use it.
func (cm CostModel) Check() error {
	var bad []string
	if cm.KVBytesPerToken <= 0 {
		bad = append(bad, fmt.Sprintf("KV bytes per token %d", cm.KVBytesPerToken))
	}
	if cm.Layers < 0 {
		bad = append(bad, fmt.Sprintf("layers %d", cm.Layers))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"local prefill tok/s", cm.LocalPrefillTokPerSec}, {"remote prefill tok/s", cm.RemotePrefillTokPerSec}, {"link Gbit/s", cm.LinkGbit}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			bad = append(bad, fmt.Sprintf("%s %v", f.name, f.v))
		}
	}
	if !(cm.LinkLatencyMs >= 0) || math.IsInf(cm.LinkLatencyMs, 0) {
		bad = append(bad, fmt.Sprintf("link latency %v ms", cm.LinkLatencyMs))
	}
	if !(cm.Margin >= 0 && cm.Margin < 1) {
		bad = append(bad, fmt.Sprintf("margin %v (want [0,1))", cm.Margin))
	}
	if cm.Streams < 0 {
		bad = append(bad, fmt.Sprintf("streams %d", cm.Streams))
	}
	if cm.MinUncached < 0 {
		bad = append(bad, fmt.Sprintf("min uncached tokens %d", cm.MinUncached))
	}
	if !(cm.Isolation >= 0) || math.IsInf(cm.Isolation, 0) {
		bad = append(bad, fmt.Sprintf("isolation %v", cm.Isolation))
	}
	if len(bad) > 0 {
		return errors.New("disagg: cost model: bad " + strings.Join(bad, ", "))
	}
	return nil
}

func (cm CostModel) margin() float64 {
	if cm.Margin == 0 {
		return DefaultMargin
	}
	return cm.Margin
}

func (cm CostModel) floor() int {
	if cm.MinUncached == 0 {
		return DefaultMinUncached
	}
	return cm.MinUncached
}

// perToken returns the seconds one token costs: a local prefill, and a
// remote one with its KV streamed back, excluding the link's latency.
//
// A remote prefill of N tokens takes P = N/remote; its KV, N·KVBytesPerToken
// bytes, takes X = bytes/link on the wire. Layer i's KV is ready after
// (i+1)/L of P and is sent while later layers compute, so the last byte
// lands at P + X/L when the link keeps up (X ≤ P) and at P/L + X when it
// does not: max(P,X) + min(P,X)/L, plus one round trip. Both terms grow
// with N, so the remote time is r·N + latency and the local time a·N.
func (cm CostModel) perToken() (local, remote, prefill, transfer float64) {
	layers := float64(max(cm.Layers, 1))
	local = 1 / cm.LocalPrefillTokPerSec
	prefill = 1 / cm.RemotePrefillTokPerSec
	transfer = float64(cm.KVBytesPerToken) * 8 / (cm.LinkGbit * 1e9)
	remote = max(prefill, transfer) + min(prefill, transfer)/layers
	return local, remote, prefill, transfer
}

// maxThreshold bounds Threshold: a break-even beyond any context length
// means never.
const maxThreshold = 1 << 30

// Threshold is the number of uncached tokens from which auto mode prefills
// remotely: the cost model's break-even, where the remote time (with the
// link's round trip) first saves the margin on the local time, and never
// below the floor (MinUncached). It is -1 when remote never saves the
// margin (a slower prefill pool, or a link too slow for the KV) or the
// cost model is incomplete.
func Threshold(cm CostModel) int {
	if cm.Check() != nil {
		return -1
	}
	local, remote, _, transfer := cm.perToken()
	// Remote wins when r·N + λ <= (1-m)·a·N, i.e. N >= λ / ((1-m)·a - r);
	// with isolation, when the KV moves the margin cheaper than it is
	// computed here and r·N + λ <= (1+s)·a·N.
	gain := (1-cm.margin())*local - remote
	if cm.Isolation > 0 {
		if transfer > (1-cm.margin())*local {
			return -1
		}
		gain = (1+cm.isolation())*local - remote
	}
	if !(gain > 0) {
		return -1
	}
	n := math.Ceil(cm.LinkLatencyMs / 1000 / gain)
	if !(n < maxThreshold) {
		return -1
	}
	return max(int(n), cm.floor(), 1)
}

// Prediction is what the cost model predicts for prefilling a number of
// tokens locally and remotely.
type Prediction struct {
	LocalMs         float64 // local prefill
	RemoteMs        float64 // remote prefill with the KV streamed back, until its last byte lands
	RemotePrefillMs float64 // the remote prefill alone
	TransferMs      float64 // the KV on the wire alone
	TransferBytes   int64   // the KV moved
}

// Predict returns the cost model's times for tokens uncached tokens (zero
// if the cost model is incomplete).
func Predict(tokens int, cm CostModel) Prediction {
	if cm.Check() != nil || tokens <= 0 {
		return Prediction{}
	}
	local, remote, prefill, transfer := cm.perToken()
	n := float64(tokens)
	return Prediction{
		LocalMs:         1000 * local * n,
		RemoteMs:        1000*remote*n + cm.LinkLatencyMs,
		RemotePrefillMs: 1000 * prefill * n,
		TransferMs:      1000 * transfer * n,
		TransferBytes:   int64(tokens) * int64(cm.KVBytesPerToken),
	}
}

// Decision is the routing decision for one request, with what it rests on
// for logs and metrics.
type Decision struct {
	Remote    bool   // prefill in the prefill pool
	Mode      Mode   // the mode decided under
	Uncached  int    // the request's uncached prompt tokens
	Threshold int    // Threshold of the cost model (-1: never)
	Reason    string // one line: why
	Prediction
}

// Decide decides whether a request with uncachedTokens prompt tokens not
// in the decode side's cache prefills remotely. A request with nothing to
// prefill stays local in every mode; otherwise ModeOn goes remote, ModeOff
// stays local, and ModeAuto goes remote when uncachedTokens reaches
// Threshold(cm).
func Decide(uncachedTokens int, cm CostModel, mode Mode) Decision {
	d := Decision{Mode: mode, Uncached: uncachedTokens, Threshold: Threshold(cm), Prediction: Predict(uncachedTokens, cm)}
	switch {
	case uncachedTokens <= 0:
		d.Reason = "local: nothing to prefill, every prompt token is cached"
	case mode == ModeOff:
		d.Reason = "local: disaggregation is off"
	case mode == ModeOn:
		d.Remote = true
		d.Reason = fmt.Sprintf("remote: disaggregation is on (%d uncached tokens)", uncachedTokens)
	case mode != ModeAuto:
		d.Reason = fmt.Sprintf("local: unknown mode %v", mode)
	default:
		d.Remote, d.Reason = decideAuto(uncachedTokens, cm, d)
	}
	return d
}

func decideAuto(n int, cm CostModel, d Decision) (bool, string) {
	if err := cm.Check(); err != nil {
		return false, fmt.Sprintf("local: %v", err)
	}
	if d.Threshold < 0 {
		local, remote, prefill, transfer := cm.perToken()
		bound := "prefill"
		if transfer > prefill {
			bound = fmt.Sprintf("link: %.3g Gbit/s moves %.0f tok/s of KV", cm.LinkGbit, 1/transfer)
		}
		if cm.Isolation > 0 {
			return false, fmt.Sprintf("local: moving the KV (%.3g ms a token) costs more than %.0f%% of computing it here (%.3g ms), or the remote time (%.3g ms a token, %s-bound) exceeds the local one by more than %.0f%%",
				1000*transfer, 100*(1-cm.margin()), 1000*local, 1000*remote, bound, 100*cm.isolation())
		}
		return false, fmt.Sprintf("local: remote never saves %.0f%%: a token takes %.3g ms remote (%s-bound) against %.3g ms local",
			100*cm.margin(), 1000*remote, bound, 1000*local)
	}
	times := fmt.Sprintf("%v remote (prefill %v, %s of KV in %v) against %v local",
		ms(d.RemoteMs), ms(d.RemotePrefillMs), bytesText(d.TransferBytes), ms(d.TransferMs), ms(d.LocalMs))
	if n < d.Threshold {
		return false, fmt.Sprintf("local: %d uncached tokens, below the threshold of %d; predicted %s", n, d.Threshold, times)
	}
	return true, fmt.Sprintf("remote: %d uncached tokens, threshold %d; predicted %s", n, d.Threshold, times)
}

func ms(x float64) time.Duration {
	d := time.Duration(x * float64(time.Millisecond))
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// Worker is what Pick knows of one prefill worker for one request.
type Worker struct {
	// CachedBlocks is the number of the request's prompt blocks already in
	// the worker's prefix cache: prefill work it saves.
	CachedBlocks int
	// QueuedBlocks is the prompt blocks queued or being prefilled on the
	// worker: work the request waits behind.
	QueuedBlocks int
}

// PickJitter is the spread, in blocks of prefill work, of the random term
// Pick adds to each worker's cost: workers within about two blocks of the
// best share the requests instead of all of them going to the first one,
// while a worker clearly better (more than two blocks) always wins.
const PickJitter = 2.0

// Pick returns the index of the prefill worker for a request, -1 if there
// is none. A worker's cost is the blocks of prefill work it has ahead of
// and for the request, up to a constant: QueuedBlocks - CachedBlocks (a
// cached block is a block not computed, a queued block one waited for),
// plus a uniform random term in [0, PickJitter) from rnd. With rnd nil the
// choice is deterministic (the lowest index among the cheapest).
func Pick(workers []Worker, rnd *rand.Rand) int {
	best, bestCost := -1, math.Inf(1)
	for i, w := range workers {
		cost := float64(max(w.QueuedBlocks, 0)) - float64(max(w.CachedBlocks, 0))
		if rnd != nil {
			cost += PickJitter * rnd.Float64()
		}
		if cost < bestCost {
			best, bestCost = i, cost
		}
	}
	return best
}
