package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/transport"
)

// remoteSubmitter passes a model's generations to its driver.
type remoteSubmitter struct{ rm *remoteModel }

func (s remoteSubmitter) Capacity() int { return int(s.rm.capacity.Load()) }

// Submit sends req to the model's driver. The generation's state stays
// here (Request plus the tokens that came back), so a generation whose
// driver is lost before it ends is sent again from where it was.
func (s remoteSubmitter) Submit(ctx context.Context, req openai.Request) (openai.Stream, error) {
	con, ok := wireConstraint(req.Constraint)
	if !ok {
		return nil, fmt.Errorf("%w: the request's constraint cannot be passed to the driver", openai.ErrBadInput)
	}
	ctx, cancel := context.WithCancel(ctx)
	rs := &remoteStream{ctx: ctx, cancel: cancel, rm: s.rm, req: Request{Op: OpGenerate, Model: s.rm.name, Vocab: s.rm.digest,
		Prompt: req.Prompt, MaxTokens: max(req.MaxTokens, 0), Sampling: req.Sampling, Logprobs: req.Logprobs,
		TopLogprobs: req.TopLogprobs, Constraint: con}}
	if err := rs.connect(false); err != nil {
		cancel()
		return nil, err
	}
	return rs, nil
}

// firstSubmitWithin bounds the tries of a new generation to reach its
// driver.
const firstSubmitWithin = 4 * time.Second

// remoteStream reads a generation's events from its driver, and sends
// the generation again when the driver is lost.
type remoteStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	rm     *remoteModel
	req    Request // Generated grows with each token
	st     *transport.Stream
	stop   func() // ends the watches of st (ctx's end, the route)
	to     Target
	cuts   int // times the generation lost its driver
	tries  int // tries to reach a driver since the last loss
}

// Cancel ends the context, which resets the driver's stream.
func (s *remoteStream) Cancel() { s.cancel() }

// retryable reports whether a generation that failed with err may be
// sent again, possibly to another driver: its driver was lost, or no
// longer drives the model. A refusal of the request itself (the queue is
// full, the prompt too long, another vocabulary) is not.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Class == classClosed || e.Class == classNotServing || e.Class == classNoModel
	}
	return !errors.Is(err, ErrUnsupported)
}

// connect sends the generation's state to the model's driver as the
// route names it, trying again while the failure is retryable and
// resubmissions are left (again: the driver was lost mid-stream, so
// every try waits first).
func (s *remoteStream) connect(again bool) error {
	cfg := s.rm.c.cfg
	var last error
	s.tries = 0
	// A new generation that finds no driver is refused soon (the
	// endpoint answers 503 and the client comes back); one that lost its
	// driver waits for the cluster to move the model.
	deadline := time.Now().Add(firstSubmitWithin)
	if again {
		s.cuts++
		deadline = time.Now().Add(cfg.MigrateWithin)
	}
	for {
		if again {
			if s.cuts > cfg.Resubmits || time.Now().After(deadline) {
				return s.lost(last)
			}
			wait := min(cfg.Backoff<<min(s.tries, 8), 2*time.Second)
			s.tries++
			select {
			case <-s.ctx.Done():
				return s.ctx.Err()
			case <-time.After(wait):
			}
		}
		again = true
		to, ok := cfg.Route(s.req.Model)
		if !ok {
			if last == nil { // else the lost driver's failure says more
				last = &Error{Class: classNotServing, Msg: fmt.Sprintf("model %s has no driver now", s.req.Model)}
			}
			continue
		}
		s.to = to
		st, h, err := s.rm.c.call(s.ctx, to, s.req)
		if err == nil {
			s.st, s.to = st, to
			s.stop = s.watch(st, to)
			if h.Capacity > 0 {
				s.rm.capacity.Store(int64(h.Capacity))
			}
			if s.cuts > 0 {
				zap.L().Named("gateway").Info("generation resubmitted", zap.String("model", s.req.Model), zap.String("driver", to.Node),
					zap.Int("generated", len(s.req.Generated)), zap.Int("loss", s.cuts), zap.Int("try", s.tries))
			}
			return nil
		}
		if s.ctx.Err() != nil {
			return s.ctx.Err()
		}
		var e *Error
		if errors.As(err, &e) && e.Class == classVocab {
			s.rm.c.forget(s.rm) // the next request fetches the new one
		}
		if !retryable(err) {
			return err
		}
		last = err
	}
}

// watch resets st when the generation's context ends, or when the route
// names a driver other than to (the plan moved the model, or the cluster
// lost to while it stalls: a paused or cut-off driver sends nothing, and
// its stream would end only when the connection times out). It returns
// the function that ends both watches.
func (s *remoteStream) watch(st *transport.Stream, to Target) func() {
	stopCtx := context.AfterFunc(s.ctx, func() { reset(st) })
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(s.rm.c.cfg.RouteCheck)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if now, ok := s.rm.c.cfg.Route(s.req.Model); ok && now.Node != to.Node {
					zap.L().Named("gateway").Info("the model's driver moved; moving the generation", zap.String("model", s.req.Model),
						zap.String("from", to.Node), zap.String("to", now.Node))
					reset(st)
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			stopCtx()
			close(done)
		})
	}
}

// lost is the error of a generation given up after its tries: the last
// driver's refusal, or a 502 (504 when it timed out) that says how far it
// got.
func (s *remoteStream) lost(last error) error {
	var e *Error
	if errors.As(last, &e) && len(s.req.Generated) == 0 {
		return last
	}
	status := http.StatusBadGateway
	var ne net.Error
	if errors.Is(last, context.DeadlineExceeded) || errors.As(last, &ne) && ne.Timeout() {
		status = http.StatusGatewayTimeout
	}
	msg := fmt.Sprintf("the agent driving model %s (%s) did not answer: %v", s.req.Model, s.to.Name, last)
	if len(s.req.Generated) > 0 {
		msg = fmt.Sprintf("the driver of model %s was lost after %d generated tokens and %d resubmissions failed (loss %d; last driver: %s): %v",
			s.req.Model, len(s.req.Generated), s.tries, s.cuts, s.to.Name, last)
	}
	return &Error{Status: status, Msg: msg}
}

// Next returns the next event. A stream cut before its final event (the
// driver or its connection went away, or it stopped driving the model)
// is resubmitted with the tokens it has, and reading goes on from the
// new driver's first token.
func (s *remoteStream) Next() (openai.Event, error) {
	for {
		if s.st == nil {
			if s.req.MaxTokens > 0 && len(s.req.Generated) >= s.req.MaxTokens {
				return openai.Event{Done: true, Reason: "length", Generated: len(s.req.Generated)}, nil
			}
			if err := s.connect(true); err != nil {
				return openai.Event{}, err
			}
		}
		ev, err := s.read()
		if err == nil {
			if !ev.Done {
				s.req.Generated = append(s.req.Generated, ev.Token)
				// A resubmission's sampler starts past the draws made.
				s.req.Sampling.Skip = ev.Draws
				return ev, nil
			}
			if ev.Reason != "error" || !retryable(ev.Err) {
				s.end()
				return ev, nil
			}
			err = ev.Err
		}
		if s.ctx.Err() != nil {
			s.end()
			return openai.Event{}, s.ctx.Err()
		}
		zap.L().Named("gateway").Warn("generation cut", zap.String("model", s.req.Model), zap.String("driver", s.to.Node),
			zap.Int("generated", len(s.req.Generated)), zap.Error(err))
		s.stop()
		reset(s.st)
		s.st = nil
	}
}

// end releases the stream of a generation that ended.
func (s *remoteStream) end() {
	if s.st != nil {
		s.stop()
		s.st.Close()
		s.st = nil
	}
}

// read reads one event frame.
func (s *remoteStream) read() (openai.Event, error) {
	b, err := transport.ReadFrame(s.st, maxEvent)
	if err != nil {
		return openai.Event{}, err
	}
	var we wireEvent
	if err := json.Unmarshal(b, &we); err != nil {
		return openai.Event{}, fmt.Errorf("malformed event from the driver: %w", err)
	}
	ev := openai.Event{Token: we.Token, Logprob: we.Logprob, Done: we.Done, Reason: we.Reason, Err: we.Err.err(),
		Generated: we.Generated, Cached: we.Cached, Draws: we.Draws, Drafted: we.Drafted, Accepted: we.Accepted}
	for _, c := range we.Top {
		ev.Top = append(ev.Top, openai.Candidate{Token: c.Token, Logprob: c.Logprob})
	}
	return ev, nil
}
