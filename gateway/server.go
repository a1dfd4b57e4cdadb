package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/engine/gguf"
	"shoal/transport"
)

// Served is a model this agent drives, as the gateway serves it to the
// other agents.
type Served struct {
	// Model runs the generations: its Submitter (nil: not serving right
	// now), Constrainer and Tokenizer (which a constraint's trigger reads).
	Model *openai.Model
	// Vocab is the model's vocabulary as a metadata-only GGUF, Digest its
	// digest (NewServed fills both).
	Vocab  []byte
	Digest string
}

// NewServed is m with the vocabulary of meta, its GGUF's metadata.
func NewServed(m *openai.Model, meta *gguf.File) (Served, error) {
	v, d, err := VocabGGUF(meta)
	if err != nil {
		return Served{}, fmt.Errorf("vocabulary of %s: %w", m.Name, err)
	}
	return Served{Model: m, Vocab: v, Digest: d}, nil
}

// Server is the driver's side: it runs the generations other agents pass
// to the models this agent drives.
type Server struct {
	models func(name string) (Served, bool)
	log    *zap.Logger
	// readTimeout bounds the wait for a request frame; writeTimeout each
	// write of the answer (a front that stops reading cannot hold a
	// generation).
	readTimeout, writeTimeout time.Duration
}

// Serve serves KindGateway streams on ep; models finds what this agent
// drives.
func Serve(ep *transport.Endpoint, models func(name string) (Served, bool)) *Server {
	s := &Server{models: models, log: zap.L().Named("gateway"), readTimeout: 10 * time.Second, writeTimeout: 30 * time.Second}
	ep.Handle(transport.KindGateway, s.serve)
	return s
}

// refuse answers a request with an error head.
func (s *Server) refuse(st *transport.Stream, class, format string, args ...any) {
	s.head(st, Head{Err: &wireError{Class: class, Msg: fmt.Sprintf(format, args...)}})
}

func (s *Server) head(st *transport.Stream, h Head) error {
	h.V = wireVersion
	b, _ := json.Marshal(h)
	_ = st.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	return transport.WriteFrame(st, b)
}

func (s *Server) serve(st *transport.Stream) {
	defer st.Close()
	if !st.Peer.Verified || st.Peer.ID == "" {
		s.refuse(st, classBadInput, "a cluster certificate is required")
		return
	}
	_ = st.SetReadDeadline(time.Now().Add(s.readTimeout))
	b, err := transport.ReadFrameAsSent(st, MaxRequestFrame)
	if err != nil {
		s.log.Debug("bad request frame", zap.String("peer", st.Peer.ID), zap.Error(err))
		s.refuse(st, classBadInput, "gateway request: %v", err)
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	req, err := ParseRequest(b)
	if err != nil {
		s.refuse(st, classBadInput, "gateway request: %v", err)
		return
	}
	sv, ok := s.models(req.Model)
	if !ok || sv.Model == nil {
		s.refuse(st, classNoModel, "model %s is not driven by this agent", req.Model)
		return
	}
	if req.Op == OpVocab {
		s.vocab(st, sv)
		return
	}
	s.generate(st, sv, req)
}

// vocab sends the model's vocabulary.
func (s *Server) vocab(st *transport.Stream, sv Served) {
	capacity := 0
	if sv.Model.Submitter != nil {
		capacity = sv.Model.Submitter.Capacity()
	}
	if s.head(st, Head{Size: len(sv.Vocab), Vocab: sv.Digest, Capacity: capacity}) != nil {
		return
	}
	for p := sv.Vocab; len(p) > 0; {
		c := p[:min(len(p), vocabChunk)]
		_ = st.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		if transport.WriteFrame(st, c) != nil {
			return
		}
		p = p[len(c):]
	}
}

// generate runs req: its prompt followed by the tokens generated so far,
// the constraint rebuilt here and advanced past them, and streams the
// events back until the generation ends or the front goes away.
func (s *Server) generate(st *transport.Stream, sv Served, req Request) {
	m := sv.Model
	switch {
	case m.Submitter == nil:
		s.refuse(st, classNotServing, "model %s is not being served right now", req.Model)
		return
	case req.Vocab != "" && req.Vocab != sv.Digest:
		s.refuse(st, classVocab, "model %s has another vocabulary on this agent (it was reloaded): send the request again", req.Model)
		return
	}
	done := len(req.Generated)
	sub := openai.Request{Prompt: append(append([]int32(nil), req.Prompt...), req.Generated...), Sampling: req.Sampling,
		Logprobs: req.Logprobs, TopLogprobs: req.TopLogprobs}
	if req.MaxTokens > 0 {
		sub.MaxTokens = req.MaxTokens - done
	}
	if n := m.Tokenizer.NVocab(); n > 0 {
		for _, id := range sub.Prompt {
			if int(id) >= n {
				s.refuse(st, classBadInput, "token id %d is outside the vocabulary of %d", id, n)
				return
			}
		}
	}
	if c := req.Constraint; c != nil {
		con, err := openai.BuildConstraint(m.Constrainer, m.Tokenizer, c.spec())
		if err != nil {
			s.refuse(st, classBadInput, "constraint: %v", err)
			return
		}
		for _, id := range req.Generated {
			if err := con.Accept(id); err != nil {
				s.refuse(st, classBadInput, "the generated tokens do not follow the constraint: %v", err)
				return
			}
		}
		sub.Constraint = con
	}
	ctx := st.Context() // ends when the front resets the stream or goes away
	stream, err := m.Submitter.Submit(ctx, sub)
	if err != nil {
		s.head(st, Head{Err: toWire(err)})
		return
	}
	defer stream.Cancel()
	if s.head(st, Head{Capacity: m.Submitter.Capacity(), Vocab: sv.Digest}) != nil {
		return
	}
	for {
		ev, err := stream.Next()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			ev = openai.Event{Done: true, Reason: "error", Err: err}
		}
		we := wireEvent{Token: ev.Token, Logprob: finite(ev.Logprob), Done: ev.Done, Reason: ev.Reason, Err: toWire(ev.Err), Cached: ev.Cached,
			Draws: ev.Draws, Drafted: ev.Drafted, Accepted: ev.Accepted}
		if ev.Done {
			we.Token, we.Generated = 0, ev.Generated+done
		}
		for _, c := range ev.Top {
			we.Top = append(we.Top, wireCand{Token: c.Token, Logprob: finite(c.Logprob)})
		}
		b, _ := json.Marshal(we)
		_ = st.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		if transport.WriteFrame(st, b) != nil || ev.Done {
			return
		}
	}
}

// finite is lp as JSON can carry it: -Inf (a token no draw can reach)
// becomes the lowest float32.
func finite(lp float32) float32 {
	switch {
	case math.IsNaN(float64(lp)) || math.IsInf(float64(lp), -1):
		return -math.MaxFloat32
	case math.IsInf(float64(lp), 1):
		return math.MaxFloat32
	}
	return lp
}
