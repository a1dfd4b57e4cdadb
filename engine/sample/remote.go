package sample

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// Request is what sampling one row takes where its logits are computed
// (the last stage of a model spread over nodes), so that only the token
// travels back instead of a row of the vocabulary's width: the parameters,
// the state of the random generator, which the row's owner keeps, and the
// tokens the penalties look at.
type Request struct {
	Params   Params  `json:"params"`
	RNG      []byte  `json:"rng,omitempty"`     // the generator's state (nil: greedy)
	History  []int32 `json:"history,omitempty"` // the penalty window's tokens
	Logprobs bool    `json:"logprobs,omitempty"`
	Top      int     `json:"top,omitempty"` // top log-probabilities wanted
	// Allow, when set, is the bitset of the tokens a constraint permits
	// (SampleAllowed); the constraint's state stays with the row's owner.
	Allow Bits `json:"allow,omitempty"`
	// After, when set, makes the row's draw depend on the row before it
	// in the same list (a drafted token verified where the logits are):
	// the row is drawn only when that one drew *After, from the generator
	// state that draw left and with *After added to the history (Chained);
	// else it is not drawn (RemoteRows gives it Token -1). Its RNG and
	// History are not read.
	After *int32 `json:"after,omitempty"`
}

// Chained is the request for the row after one drawn with r that drew
// res: r's parameters, the generator state res left, and res.Token added
// to the penalty window.
func (r Request) Chained(res *Result) Request {
	n := r
	n.After = nil
	if res.RNG != nil {
		n.RNG = res.RNG
	}
	if r.History != nil {
		h := append(make([]int32, 0, len(r.History)+1), r.History...)
		h = append(h, res.Token)
		if w := r.Params.RepeatLastN; w > 0 && len(h) > w {
			h = h[len(h)-w:]
		}
		n.History = h
	}
	return n
}

// RemoteRows draws every row i of rows (logits(i), nVocab wide) as
// reqs[i] says, with the sampler sampler(params) gives, into out. A row
// whose request has After is drawn only when the row before it drew that
// token (see Request.After); else its result is Token -1, and so is every
// later row chained to it.
func RemoteRows(reqs []Request, logits func(i int) []float32, sampler func(Params) *Sampler, out []Result) error {
	var prev Request // the request the row before was drawn with
	for i := range reqs {
		r := reqs[i]
		if r.After != nil {
			if i == 0 || out[i-1].Token != *r.After {
				out[i] = Result{Token: -1}
				continue
			}
			c := prev.Chained(&out[i-1])
			c.Logprobs, c.Top = r.Logprobs, r.Top
			r = c
		}
		var err error
		if out[i], err = sampler(r.Params).Remote(&r, logits(i)); err != nil {
			return err
		}
		prev = r
	}
	return nil
}

// Constraint is one sequence's constrained-decoding state (a grammar or a
// JSON schema: engine/sample/grammar): the tokens it allows next, and its
// advance by the token drawn.
type Constraint interface {
	// Mask is the bitset of the tokens allowed next (Bits' layout); nil
	// allows every token. A mask with no bit set means nothing can follow:
	// the generation cannot go on.
	Mask() []uint64
	// Accept advances the state by tok, which the mask allowed.
	Accept(tok int32) error
	// Done reports that nothing but the end of generation can follow.
	Done() bool
}

// Bits is a token bitset (bit i of word i/64 is token i) that travels in
// JSON as base64 of its little-endian bytes, a sixth of its size as numbers.
type Bits []uint64

// MarshalJSON encodes b as a base64 string.
func (b Bits) MarshalJSON() ([]byte, error) {
	raw := make([]byte, 8*len(b))
	for i, w := range b {
		binary.LittleEndian.PutUint64(raw[8*i:], w)
	}
	return json.Marshal(raw)
}

// UnmarshalJSON decodes a base64 string of whole 64-bit words.
func (b *Bits) UnmarshalJSON(data []byte) error {
	var raw []byte
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("sample: token bitset: %w", err)
	}
	if len(raw)%8 != 0 {
		return fmt.Errorf("sample: token bitset of %d bytes is not whole 64-bit words", len(raw))
	}
	out := make(Bits, len(raw)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(raw[8*i:])
	}
	*b = out
	return nil
}

// Result is a sampled row: the token, its log-probability and the top
// ones when asked, and the generator's state after the draw, which the
// row's owner adopts.
type Result struct {
	Token   int32          `json:"token"`
	Logprob float32        `json:"logprob,omitempty"`
	Top     []TokenLogprob `json:"top,omitempty"`
	RNG     []byte         `json:"rng,omitempty"`
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	Token   int32   `json:"token"`
	Logprob float32 `json:"logprob"`
}

// Request describes the next draw of s for a row whose tokens so far are
// history, for Sampler.Remote to make elsewhere. It does not advance s.
func (s *Sampler) Request(history []int32, logprobs bool, top int) Request {
	r := Request{Params: s.p, Logprobs: logprobs, Top: top}
	r.Params.Skip = 0 // the generator's state travels instead
	if !s.greedy {
		r.RNG, _ = s.rng.MarshalBinary()
	}
	if s.penalties {
		win := history
		if n := s.p.RepeatLastN; n > 0 && len(win) > n {
			win = win[len(win)-n:]
		}
		r.History = win
	}
	return r
}

// Remote samples logits as r says, with s made by New(r.Params, ...) (its
// own random state is replaced by r's): the token Sample would have drawn
// on r's owner, and the generator's state after it.
func (s *Sampler) Remote(r *Request, logits []float32) (Result, error) {
	if r.RNG != nil {
		if err := s.rng.UnmarshalBinary(r.RNG); err != nil {
			return Result{}, fmt.Errorf("sample: the request's generator state: %w", err)
		}
	}
	res := Result{Token: s.SampleAllowed(logits, r.History, r.Allow)}
	if r.RNG != nil {
		res.RNG, _ = s.rng.MarshalBinary()
	}
	if r.Logprobs || r.Top > 0 {
		res.Logprob, res.Top = Logprobs(logits, res.Token, r.Top)
	}
	return res, nil
}

// Adopt takes the generator's state a Remote draw for s left (a draw
// when the state moved: a Remote sample makes one at most).
func (s *Sampler) Adopt(r *Result) error {
	if r.RNG == nil {
		return nil
	}
	before, _ := s.rng.MarshalBinary()
	if err := s.rng.UnmarshalBinary(r.RNG); err != nil {
		return err
	}
	if !bytes.Equal(before, r.RNG) {
		s.draws++
	}
	return nil
}

// Params are the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Logprobs returns the log-probability of tok and the top n tokens.
func Logprobs(l []float32, tok int32, n int) (float32, []TokenLogprob) {
	mx := float32(math.Inf(-1))
	for _, v := range l {
		mx = max(mx, v)
	}
	var sum float64
	for _, v := range l {
		sum += math.Exp(float64(v - mx))
	}
	lse := float64(mx) + math.Log(sum)
	lp := float32(float64(l[tok]) - lse)
	if n <= 0 {
		return lp, nil
	}
	top := make([]TokenLogprob, 0, n+1)
	for id, v := range l {
		if len(top) < n || v > top[len(top)-1].Logprob {
			e := TokenLogprob{Token: int32(id), Logprob: v}
			i := sort.Search(len(top), func(i int) bool { return top[i].Logprob < v })
			top = append(top, TokenLogprob{})
			copy(top[i+1:], top[i:])
			top[i] = e
			if len(top) > n {
				top = top[:n]
			}
		}
	}
	for i := range top {
		top[i].Logprob = float32(float64(top[i].Logprob) - lse)
	}
	return lp, top
}
