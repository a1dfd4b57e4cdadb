package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"shoal/api/openai"
	"shoal/engine/tokenizer"
	"shoal/transport"
)

// Target is where a model's driver runs.
type Target struct {
	Addr string // its QUIC address
	Node string // its node ID, which its certificate must name ("": any)
	Name string // its node name, for messages
}

// Config of a Client.
type Config struct {
	Endpoint *transport.Endpoint
	// Route says where model's driver runs now; it is asked again for
	// every resubmission.
	Route func(model string) (Target, bool)
	// Local builds this agent's tokenizer and constrainer of a
	// vocabulary fetched from a driver (the node's, as for the models
	// it runs itself).
	Local func(tok *tokenizer.Tokenizer, chatTemplate string) (openai.Tokenizer, openai.Constrainer)
	// Resubmits bounds how often one generation is sent again after
	// its driver was lost (default 8). After each loss it is tried again
	// until a driver takes it or MigrateWithin passes (default 90 s: the
	// cluster must notice the loss, re-plan the model and load the new
	// driver's shards); Backoff is the first wait between tries, doubled
	// each time up to 2 s (default 250 ms).
	Resubmits     int
	MigrateWithin time.Duration
	Backoff       time.Duration
	// RouteCheck is how often a running generation asks the route
	// (default 1 s): when it names another driver, the generation moves
	// there from the tokens it has, so a driver that stalls (paused, cut
	// off) or that the plan moved does not hold it.
	RouteCheck time.Duration
	// DialTimeout bounds reaching a driver (default 10 s), HeadTimeout
	// its first answer (default 30 s).
	DialTimeout, HeadTimeout time.Duration
}

// Client is the front's side: models other agents drive, served here.
type Client struct {
	cfg Config

	mu     sync.Mutex
	models map[string]*remoteModel
}

// ErrUnsupported is the error of a driver that has no gateway (an agent
// of an older version): the caller passes the HTTP request on instead.
var ErrUnsupported = errors.New("the driver does not take token-level requests")

// NewClient returns a client.
func NewClient(cfg Config) *Client {
	if cfg.Resubmits == 0 {
		cfg.Resubmits = 8
	}
	if cfg.MigrateWithin <= 0 {
		cfg.MigrateWithin = 90 * time.Second
	}
	if cfg.RouteCheck <= 0 {
		cfg.RouteCheck = time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 250 * time.Millisecond
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.HeadTimeout <= 0 {
		cfg.HeadTimeout = 30 * time.Second
	}
	return &Client{cfg: cfg, models: map[string]*remoteModel{}}
}

// remoteModel is a model another agent drives, as this one serves it.
type remoteModel struct {
	c        *Client
	name     string
	digest   string // of the vocabulary
	capacity atomic.Int64
	model    *openai.Model
}

// Model is the model called name, served here with its driver's
// vocabulary (fetched from the driver the route names, once per
// vocabulary) and a Submitter that passes generations to the driver.
func (c *Client) Model(ctx context.Context, name string) (*openai.Model, error) {
	c.mu.Lock()
	rm := c.models[name]
	c.mu.Unlock()
	if rm != nil {
		return rm.model, nil
	}
	to, ok := c.cfg.Route(name)
	if !ok {
		return nil, &Error{Class: classNoModel, Msg: fmt.Sprintf("model %s has no driver", name)}
	}
	rm, err := c.fetch(ctx, name, to)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.models[name]; old != nil {
		return old.model, nil
	}
	c.models[name] = rm
	return rm.model, nil
}

// Cached is the model called name if its vocabulary is here and the
// route names a driver for it now.
func (c *Client) Cached(name string) (*openai.Model, bool) {
	c.mu.Lock()
	rm := c.models[name]
	c.mu.Unlock()
	if rm == nil {
		return nil, false
	}
	if _, ok := c.cfg.Route(name); !ok {
		return nil, false
	}
	return rm.model, true
}

// forget drops rm (its driver has another vocabulary now).
func (c *Client) forget(rm *remoteModel) {
	c.mu.Lock()
	if c.models[rm.name] == rm {
		delete(c.models, rm.name)
	}
	c.mu.Unlock()
}

// call opens a stream to to, sends req and reads the answer's head.
func (c *Client) call(ctx context.Context, to Target, req Request) (*transport.Stream, Head, error) {
	req.V = wireVersion
	b, err := json.Marshal(req)
	if err != nil {
		return nil, Head{}, err
	}
	if len(b) > MaxRequestFrame {
		return nil, Head{}, &Error{Class: classTooLong, Msg: fmt.Sprintf("the request is %d bytes, more than a driver takes (%d)", len(b), MaxRequestFrame)}
	}
	dctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	st, err := c.cfg.Endpoint.DialAs(dctx, to.Addr, transport.KindGateway, to.Node, "")
	cancel()
	if err != nil {
		return nil, Head{}, err
	}
	fail := func(err error) (*transport.Stream, Head, error) {
		reset(st)
		if transport.IsUnknownKind(err) {
			err = fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return nil, Head{}, err
	}
	stop := context.AfterFunc(ctx, func() { reset(st) })
	defer stop()
	_ = st.SetDeadline(time.Now().Add(c.cfg.HeadTimeout))
	if err := transport.WriteFrame(st, b); err != nil {
		return fail(err)
	}
	_ = st.CloseWrite()
	hb, err := transport.ReadFrame(st, maxHead)
	if errors.Is(err, io.EOF) {
		err = errors.New("the driver closed the stream without an answer")
	}
	if err != nil {
		return fail(err)
	}
	_ = st.SetDeadline(time.Time{})
	var h Head
	if err := json.Unmarshal(hb, &h); err != nil || h.V != wireVersion {
		return fail(fmt.Errorf("malformed answer head from the driver"))
	}
	if h.Err != nil {
		return fail(h.Err.err())
	}
	return st, h, nil
}

// reset ends st both ways at once (the driver's generation stops).
func reset(st *transport.Stream) {
	st.CancelRead(codeCanceled)
	st.CancelWrite(codeCanceled)
}

const codeCanceled = 0x30

// fetch reads model name's vocabulary from to and builds the model.
func (c *Client) fetch(ctx context.Context, name string, to Target) (*remoteModel, error) {
	st, h, err := c.call(ctx, to, Request{Op: OpVocab, Model: name})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if h.Size <= 0 || h.Size > maxVocab {
		return nil, fmt.Errorf("vocabulary of %d bytes (1 to %d)", h.Size, maxVocab)
	}
	_ = st.SetReadDeadline(time.Now().Add(c.cfg.HeadTimeout + time.Duration(h.Size)*time.Second/(1<<20)))
	buf := make([]byte, 0, h.Size)
	for len(buf) < h.Size {
		p, err := transport.ReadFrame(st, vocabChunk)
		if err != nil {
			return nil, fmt.Errorf("reading the vocabulary of %s: %w", name, err)
		}
		if len(p) == 0 || len(buf)+len(p) > h.Size {
			return nil, fmt.Errorf("reading the vocabulary of %s: more than the %d bytes announced", name, h.Size)
		}
		buf = append(buf, p...)
	}
	if d := digest(buf); d != h.Vocab {
		return nil, fmt.Errorf("the vocabulary of %s does not match its digest", name)
	}
	tok, tpl, err := parseVocab(buf)
	if err != nil {
		return nil, fmt.Errorf("the vocabulary of %s: %w", name, err)
	}
	rm := &remoteModel{c: c, name: name, digest: h.Vocab}
	rm.capacity.Store(int64(h.Capacity))
	t, cons := c.cfg.Local(tok, tpl)
	m := &openai.Model{Name: name, Tokenizer: t, Submitter: remoteSubmitter{rm}, Created: time.Now(), OwnedBy: to.Node}
	if cons != nil {
		m.Constrainer = specConstrainer{cons}
	}
	rm.model = m
	return rm, nil
}
