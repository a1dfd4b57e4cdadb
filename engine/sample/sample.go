package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Params configures a Sampler. The zero value is greedy decoding with no
// penalties.
type Params struct {
	Temperature      float32 // <= 0 means greedy (argmax; ties → lowest id)
	TopK             int     // <= 0 disables
	TopP             float32 // >= 1 or <= 0 disables
	MinP             float32 // <= 0 disables
	RepeatPenalty    float32 // 1 or 0 disables (llama.cpp semantics: logit>0 → /p, else *p)
	RepeatLastN      int     // window of recent tokens the penalties look at (0 = none, -1 = all history)
	PresencePenalty  float32 // logit -= presence for every token seen in the window
	FrequencyPenalty float32 // logit -= count*frequency for every token seen in the window
	Seed             uint64  // seeds the random draw
	// Skip is how many draws from Seed's generator an earlier sampler
	// of the same sequence made (a generation moved to another driver):
	// this one starts past them, so it draws what that one would have.
	Skip uint64
}

// MaxSkip bounds Params.Skip: more draws than a context has tokens.
const MaxSkip = 1 << 22

// DefaultParams returns llama.cpp's usual defaults: temperature 0.8, top-k
// 40, top-p 0.95, min-p 0.05, repeat penalty 1.0 (off), last-n 64, seed 0.
func DefaultParams() Params {
	return Params{
		Temperature:   0.8,
		TopK:          40,
		TopP:          0.95,
		MinP:          0.05,
		RepeatPenalty: 1.0,
		RepeatLastN:   64,
	}
}

// Validate reports every out-of-range field. It is stricter than New, which
// interprets any value as documented on the fields: Validate is meant for
// checking user-supplied configuration.
func (p Params) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("sample: "+format, args...))
	}
	finite := func(v float32) bool {
		return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
	}
	switch {
	case !finite(p.Temperature):
		bad("temperature must be a finite number, got %v", p.Temperature)
	case p.Temperature < 0:
		bad("temperature must be >= 0 (0 means greedy), got %v", p.Temperature)
	}
	if p.TopK < 0 {
		bad("top-k must be >= 0 (0 disables), got %d", p.TopK)
	}
	if !(p.TopP >= 0 && p.TopP <= 1) { // also catches NaN
		bad("top-p must be in [0, 1] (0 or 1 disables), got %v", p.TopP)
	}
	if !(p.MinP >= 0 && p.MinP <= 1) {
		bad("min-p must be in [0, 1] (0 disables), got %v", p.MinP)
	}
	switch {
	case !finite(p.RepeatPenalty):
		bad("repeat penalty must be a finite number, got %v", p.RepeatPenalty)
	case p.RepeatPenalty < 0:
		bad("repeat penalty must be >= 0 (0 or 1 disables), got %v", p.RepeatPenalty)
	}
	if p.Skip > MaxSkip {
		bad("skip must be at most %d draws, got %d", MaxSkip, p.Skip)
	}
	if p.RepeatLastN < -1 {
		bad("repeat last-n must be >= -1 (-1 means all history, 0 none), got %d", p.RepeatLastN)
	}
	if !finite(p.PresencePenalty) {
		bad("presence penalty must be a finite number, got %v", p.PresencePenalty)
	}
	if !finite(p.FrequencyPenalty) {
		bad("frequency penalty must be a finite number, got %v", p.FrequencyPenalty)
	}
	return errors.Join(errs...)
}

// Top-p over the full vocabulary buckets tokens by their distance from the
// maximum logit to find a cheap cut-off, then sorts only the tokens above it.
const (
	histScale   = 8                       // buckets per logit unit
	histBuckets = 32 * histScale          // covers distances [0, 32)
	histRange   = histBuckets / histScale // 32
)

// Sampler picks tokens according to Params. Create it with New; it is not
// safe for concurrent use.
type Sampler struct {
	p Params

	// Normalized settings derived from p.
	greedy    bool
	noFilter  bool // no top-p/min-p (top-k may still apply)
	invTemp   float64
	topK      int     // 0 = off
	topP      float64 // 0 = off
	logMinP   float32 // min-p threshold offset in logit space; -Inf = off
	penalties bool
	repeat    float32 // 1 = off

	rng   rand.PCG
	draws uint64 // made by rng since its seed

	// Reused buffers.
	work   []float32 // penalized copy of the logits
	masked []float32 // the logits a constraint allows (SampleAllowed)
	counts []int32   // per-token counts in the penalty window (kept all zero between calls)
	cands  []uint64  // candidates as rank keys (see key)
	w      []float64
	hist   [histBuckets]float64
}

// New returns a Sampler for a vocabulary of nVocab tokens, with buffers
// sized for it. Params are not validated (see Params.Validate); each field is
// interpreted as documented, and NaN values disable their filter. New panics
// if nVocab <= 0.
func New(p Params, nVocab int) *Sampler {
	if nVocab <= 0 {
		panic(fmt.Sprintf("sample: New: nVocab must be > 0, got %d", nVocab))
	}
	s := &Sampler{p: p}
	s.greedy = !(p.Temperature > 0)        // also NaN
	s.invTemp = 1 / float64(p.Temperature) // +Inf → 0: uniform over the candidates
	if p.TopK > 0 {
		s.topK = p.TopK
	}
	if p.TopP > 0 && p.TopP < 1 {
		s.topP = float64(p.TopP)
	}
	s.logMinP = float32(math.Inf(-1))
	if p.MinP > 0 {
		// min-p > 1 (rejected by Validate) keeps only the top logit.
		s.logMinP = float32(min(math.Log(float64(p.MinP)), 0))
	}
	s.repeat = 1
	if r := p.RepeatPenalty; r == r && r != 0 {
		s.repeat = r
	}
	if p.PresencePenalty != p.PresencePenalty {
		s.p.PresencePenalty = 0
	}
	if p.FrequencyPenalty != p.FrequencyPenalty {
		s.p.FrequencyPenalty = 0
	}
	s.noFilter = s.topP == 0 && !(p.MinP > 0)
	s.penalties = p.RepeatLastN != 0 &&
		(s.repeat != 1 || s.p.PresencePenalty != 0 || s.p.FrequencyPenalty != 0)
	s.Reset(p.Seed)
	for range min(p.Skip, MaxSkip) {
		s.rng.Uint64()
	}
	s.draws = min(p.Skip, MaxSkip)
	s.grow(nVocab)
	return s
}

// Reset reseeds the random generator, so the following draws are exactly
// those of a fresh Sampler created with this seed.
func (s *Sampler) Reset(seed uint64) {
	s.p.Seed = seed
	s.rng.Seed(seed, seed^0x9e3779b97f4a7c15)
	s.draws = 0
}

// Draws is how many random draws the generator has made since its seed
// (Params.Skip included): what a sampler that continues the sequence
// elsewhere skips.
func (s *Sampler) Draws() uint64 { return s.draws }

// grow makes sure the buffers fit a vocabulary of n tokens. It allocates
// only when n exceeds every size seen before.
func (s *Sampler) grow(n int) {
	if s.penalties && len(s.work) < n {
		s.work = make([]float32, n)
		s.counts = make([]int32, n)
	}
	if !s.greedy {
		need := n
		if s.topK > 0 && s.topK < n {
			need = s.topK
		}
		if cap(s.cands) < need {
			s.cands = make([]uint64, need)
			s.w = make([]float64, need)
		}
	}
}

// Sample returns the next token for logits (one per vocabulary entry).
// history holds all tokens so far (prompt and generated); the penalties look
// at its last RepeatLastN entries, and ids outside the vocabulary are
// ignored. logits is never modified. Logits that are NaN are never chosen;
// if no logit is above -Inf token 0 is returned, and +Inf logits win
// outright (lowest id first). Sample panics if logits is empty.
//
// After the first call (for a given vocabulary size), Sample does not
// allocate.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	return s.SampleAllowed(logits, history, nil)
}

// SampleAllowed is Sample over the tokens allow permits (a bitset, bit i of
// word i/64 for token i; nil permits every token): the others are removed
// before every filter, so the draw follows the constrained distribution
// exactly (constrained decoding). If allow permits no token (or only tokens
// whose logits are -Inf or NaN), token 0 is returned as by Sample; callers
// check their constraint's mask for that case first.
func (s *Sampler) SampleAllowed(logits []float32, history []int32, allow []uint64) int32 {
	if len(logits) == 0 {
		panic("sample: Sample: empty logits")
	}
	s.grow(len(logits))
	src := s.penalize(logits, history)
	if allow != nil {
		src = s.restrict(src, allow)
	}
	if s.greedy {
		return Argmax(src)
	}
	if s.noFilter && (s.topK == 0 || s.topK >= len(src)) {
		return s.drawDense(src)
	}
	return s.draw(s.filter(src))
}

// restrict returns src with every token allow does not permit at -Inf, in
// the sampler's private buffer.
func (s *Sampler) restrict(src []float32, allow []uint64) []float32 {
	n := len(src)
	if len(s.masked) < n {
		s.masked = make([]float32, n)
	}
	out := s.masked[:n]
	ninf := float32(math.Inf(-1))
	for w := 0; w*64 < n; w++ {
		var bits uint64
		if w < len(allow) {
			bits = allow[w]
		}
		lo, hi := w*64, min(w*64+64, n)
		switch bits {
		case 0:
			for i := lo; i < hi; i++ {
				out[i] = ninf
			}
		case ^uint64(0):
			copy(out[lo:hi], src[lo:hi])
		default:
			for i := lo; i < hi; i++ {
				if bits&(1<<uint(i-lo)) != 0 {
					out[i] = src[i]
				} else {
					out[i] = ninf
				}
			}
		}
	}
	return out
}

// Argmax returns the lowest id of the largest logit, ignoring NaN; 0 if all
// are -Inf or NaN: the greedy choice.
func Argmax(x []float32) int32 {
	best, bi := float32(math.Inf(-1)), 0
	for i, v := range x {
		if v > best {
			best, bi = v, i
		}
	}
	return int32(bi)
}

// penalize returns logits with the repetition, presence and frequency
// penalties applied, in a private buffer, or logits itself when no penalty
// applies.
func (s *Sampler) penalize(logits []float32, history []int32) []float32 {
	if !s.penalties || len(history) == 0 {
		return logits
	}
	win := history
	if n := s.p.RepeatLastN; n > 0 && len(win) > n {
		win = win[len(win)-n:]
	}
	n := uint32(len(logits))
	work := s.work[:n]
	copy(work, logits)
	counts := s.counts[:n]
	for _, t := range win {
		if uint32(t) < n {
			counts[t]++
		}
	}
	rp, pres, freq := s.repeat, s.p.PresencePenalty, s.p.FrequencyPenalty
	for _, t := range win {
		if uint32(t) >= n || counts[t] == 0 {
			continue
		}
		c := counts[t]
		counts[t] = 0 // leave counts zeroed for the next call
		v := work[t]
		if rp != 1 {
			if v <= 0 {
				v = float32(v * rp) // explicit rounding: no fused multiply-add
			} else {
				v /= rp
			}
		}
		v -= float32(float32(c)*freq) + pres
		work[t] = v
	}
	return work
}

// Candidates are kept as rank keys: a uint64 whose natural order is
// descending logit, then ascending id. Sorting keys needs no comparison
// callback, and the heap and the cut-offs compare plain integers.

// key packs a token id and its (non-NaN) logit into a rank key.
func key(id int, v float32) uint64 {
	b := math.Float32bits(v)
	if b&(1<<31) != 0 { // order-preserving map from float32 to uint32
		b = ^b
	} else {
		b |= 1 << 31
	}
	return uint64(^b)<<32 | uint64(uint32(id))
}

// keyID returns the token id packed in k.
func keyID(k uint64) int32 { return int32(uint32(k)) }

// keyLogit returns the logit packed in k.
func keyLogit(k uint64) float32 {
	b := ^uint32(k >> 32)
	if b&(1<<31) != 0 {
		b &^= 1 << 31
	} else {
		b = ^b
	}
	return math.Float32frombits(b)
}

// expNeg returns e^-d for d >= 0, with a relative error below 1e-9; 0 for
// d >= 708 (e^-708 is about the smallest normal float64), +Inf or NaN. It
// splits d into q + j/32 + r with r in [0, 1/32), so e^-d = e^-q · e^-j/32 ·
// e^-r: two table entries and a degree-4 Taylor polynomial. It is about
// three times faster than math.Exp, which matters at 150k tokens.
//
// The explicit float64 conversions forbid fused multiply-adds (Go may fuse
// on arm64, ppc64 and s390x but not amd64), so results, and hence sampled
// tokens, are bit-identical on every platform.
func expNeg(d float64) float64 {
	d = float64(d) // round a caller's product before it is reused
	if !(d < expMax) {
		return 0
	}
	i := int(d * 32)
	r := d - float64(i)*(1.0/32) // exact
	p := 1 - float64(r*(1-float64(r*(1.0/2-float64(r*(1.0/6-float64(r*(1.0/24))))))))
	return float64(expInt[i>>5] * expFrac[i&31] * p)
}

const expMax = 708

var (
	expInt  [expMax]float64 // e^-q
	expFrac [32]float64     // e^-(j/32)
)

func init() {
	for q := range expInt {
		expInt[q] = math.Exp(-float64(q))
	}
	for j := range expFrac {
		expFrac[j] = math.Exp(-float64(j) / 32)
	}
}

// drawDense draws from softmax(logits/T) over the whole vocabulary, when no
// filter is active.
func (s *Sampler) drawDense(src []float32) int32 {
	mi := Argmax(src)
	maxv := src[mi]
	if !(maxv > float32(math.Inf(-1))) || math.IsInf(float64(maxv), 1) {
		return mi // all -Inf/NaN, or +Inf wins
	}
	w := s.w[:len(src)]
	var sum float64
	for i, v := range src {
		e := expNeg(float64(maxv-v) * s.invTemp) // NaN and -Inf give 0
		w[i] = e
		sum += e
	}
	return int32(s.pick(w, sum))
}

// pick draws an index with probability w[i]/sum.
func (s *Sampler) pick(w []float64, sum float64) int {
	u := float64(s.rng.Uint64()>>11) * 0x1p-53 * sum
	s.draws++
	var cum float64
	for i, e := range w {
		cum += e
		if cum > u {
			return i
		}
	}
	for i := len(w) - 1; i > 0; i-- { // rounding: last index with weight
		if w[i] > 0 {
			return i
		}
	}
	return 0
}

// filter applies top-k, top-p and min-p and returns the surviving
// candidates (never empty), sorted best first unless no sorting was needed.
func (s *Sampler) filter(src []float32) []uint64 {
	if s.topK > 0 && s.topK < len(src) {
		c := s.topKSelect(src)
		if len(c) == 0 || math.IsInf(float64(keyLogit(c[0])), -1) {
			return s.single(0) // no logit above -Inf
		}
		if math.IsInf(float64(keyLogit(c[0])), 1) {
			return c[:1] // +Inf wins outright (lowest id first)
		}
		if s.topP > 0 {
			c = cutTopP(c, s.topP)
		}
		return cutMinP(c, s.logMinP)
	}

	mi := Argmax(src)
	maxv := src[mi]
	if !(maxv > float32(math.Inf(-1))) || math.IsInf(float64(maxv), 1) {
		return s.single(mi)
	}
	if s.topP > 0 {
		return s.topPFull(src, maxv)
	}
	// Only min-p: a threshold, no sorting needed.
	t := maxv + s.logMinP
	c := s.cands[:0]
	for i, v := range src {
		if v >= t {
			c = append(c, key(i, v))
		}
	}
	return c
}

// single returns a one-candidate list holding id.
func (s *Sampler) single(id int32) []uint64 {
	c := s.cands[:1]
	c[0] = key(int(id), 0)
	return c
}

// siftDown restores the max-heap property (root = worst rank) below i.
func siftDown(h []uint64, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r] > h[l] {
			m = r
		}
		if h[m] <= h[i] {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// topKSelect returns the topK best non-NaN tokens, sorted best first, using
// a bounded heap: one pass over the vocabulary, O(n + k log k) typical.
func (s *Sampler) topKSelect(src []float32) []uint64 {
	k := s.topK
	h := s.cands[:0]
	i := 0
	for ; i < len(src) && len(h) < k; i++ {
		if v := src[i]; v == v {
			h = append(h, key(i, v))
		}
	}
	for j := len(h)/2 - 1; j >= 0; j-- {
		siftDown(h, j)
	}
	if len(h) == k {
		floor := keyLogit(h[0])
		for j, v := range src[i:] {
			// Later ids lose ties, so only a strictly larger logit enters.
			if v > floor {
				h[0] = key(i+j, v)
				siftDown(h, 0)
				floor = keyLogit(h[0])
			}
		}
	}
	slices.Sort(h)
	return h
}

// cutTopP keeps the shortest prefix of sorted candidates whose probability
// mass (softmax over c at temperature 1) reaches p.
func cutTopP(c []uint64, p float64) []uint64 {
	maxv := keyLogit(c[0])
	var z float64
	for _, k := range c {
		z += expNeg(float64(maxv - keyLogit(k)))
	}
	target := p * z
	var cum float64
	for i, k := range c {
		cum += expNeg(float64(maxv - keyLogit(k)))
		if cum >= target {
			return c[:i+1]
		}
	}
	return c
}

// cutMinP keeps the prefix of sorted candidates with p >= min_p * p_max,
// i.e. logit >= max + log(min_p); at least one.
func cutMinP(c []uint64, logMinP float32) []uint64 {
	t := keyLogit(c[0]) + logMinP
	m := 1
	for m < len(c) && keyLogit(c[m]) >= t {
		m++
	}
	return c[:m]
}

// topPFull applies top-p (then min-p) over the whole vocabulary. A histogram
// of probability mass by distance from the maximum logit gives a distance
// below which the kept set is sure to lie; only tokens within it are
// collected and sorted. Tokens 32 or more below the maximum each weigh less
// than 1.3e-14 of the maximum and are left out of the mass: top-p can only
// need them when 1-p is below n·1.3e-14, which a float32 p < 1 never is for
// any real vocabulary.
func (s *Sampler) topPFull(src []float32, maxv float32) []uint64 {
	hist := &s.hist
	clear(hist[:])
	for _, v := range src {
		d := maxv - v // >= 0; +Inf for -Inf, NaN for NaN
		if d < histRange {
			hist[int(d*histScale)] += expNeg(float64(d))
		}
	}
	var z float64
	for _, m := range hist {
		z += m
	}
	target := s.topP * z

	// Smallest bucket prefix holding the target mass.
	dcut := float32(histRange)
	var cum float64
	for b, m := range hist {
		cum += m
		if cum >= target {
			dcut = float32(b+1) / histScale
			break
		}
	}
	t := maxv + s.logMinP // min-p threshold (-Inf when off)

	c := s.cands[:0]
	for i, v := range src {
		if maxv-v < dcut && v >= t {
			c = append(c, key(i, v))
		}
	}
	slices.Sort(c)

	// Exact cut, with the mass measured against the whole vocabulary.
	cum = 0
	for i, k := range c {
		cum += expNeg(float64(maxv - keyLogit(k)))
		if cum >= target {
			return c[:i+1]
		}
	}
	return c // min-p cut deeper than top-p, or rounding at the boundary
}

// draw applies the temperature, takes the softmax over the candidates and
// draws one token with the seeded generator.
func (s *Sampler) draw(c []uint64) int32 {
	if len(c) == 1 {
		return keyID(c[0])
	}
	maxv := keyLogit(c[0])
	for _, k := range c[1:] {
		maxv = max(maxv, keyLogit(k))
	}
	w := s.w[:len(c)]
	var sum float64
	for i, k := range c {
		e := expNeg(float64(maxv-keyLogit(k)) * s.invTemp)
		w[i] = e
		sum += e
	}
	return keyID(c[s.pick(w, sum)])
}
