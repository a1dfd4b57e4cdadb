package openai

import (
	"context"
	"errors"
	"sync"
	"time"

	"shoal/engine/tokenizer"
	"shoal/serve"
)

// Model is one model the endpoint serves.
type Model struct {
	Name string
	Tok  *tokenizer.Tokenizer
	// ChatTemplate is the model's tokenizer.chat_template ("" means none:
	// the handler falls back to ChatML and says so in /v1/models).
	ChatTemplate string
	// Sched runs the model on this node. It may be nil for a model served
	// elsewhere in the cluster, when the Backend is a Router.
	Sched   *serve.Scheduler
	Created time.Time
	OwnedBy string
}

// Submitter runs generations: *serve.Scheduler is the local one; a node can
// provide one that forwards token ids to the nodes holding a model.
type Submitter interface {
	// Submit queues a request; see serve.Scheduler.Submit for the events
	// and the errors (serve.ErrQueueFull, ErrTooLong, ErrBadInput,
	// ErrClosed). Other errors may implement HTTPStatus() int.
	Submit(ctx context.Context, req serve.Request) (<-chan serve.Event, error)
	// Capacity is the longest sequence (prompt plus generated tokens).
	Capacity() int
}

// Backend is what the endpoint serves: the node provides it.
type Backend interface {
	Models() []*Model
	Model(name string) (*Model, bool)
}

// Router is an optional Backend extension that chooses where a request
// runs. Without it the handler submits to Model.Sched.
type Router interface {
	Submitter(ctx context.Context, m *Model) (Submitter, error)
}

// ErrNotServing is returned for a model that has no Submitter here.
var ErrNotServing = errors.New("the model is not being served right now")

func submitterFor(ctx context.Context, b Backend, m *Model) (Submitter, error) {
	if r, ok := b.(Router); ok {
		return r.Submitter(ctx, m)
	}
	if m.Sched == nil {
		return nil, ErrNotServing
	}
	return m.Sched, nil
}

// StaticBackend is a Backend over a fixed set of models, safe for
// concurrent use; Set replaces a model (by name).
type StaticBackend struct {
	mu     sync.RWMutex
	models []*Model
}

// NewStaticBackend returns a backend serving models.
func NewStaticBackend(models ...*Model) *StaticBackend {
	return &StaticBackend{models: models}
}

// Models returns the models in the order they were added.
func (b *StaticBackend) Models() []*Model {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return append([]*Model(nil), b.models...)
}

// Model finds a model by name.
func (b *StaticBackend) Model(name string) (*Model, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, m := range b.models {
		if m.Name == name {
			return m, true
		}
	}
	return nil, false
}

// Set adds m or replaces the model with its name.
func (b *StaticBackend) Set(m *Model) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, old := range b.models {
		if old.Name == m.Name {
			b.models[i] = m
			return
		}
	}
	b.models = append(b.models, m)
}

// Remove drops the model with the given name.
func (b *StaticBackend) Remove(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range b.models {
		if m.Name == name {
			b.models = append(b.models[:i], b.models[i+1:]...)
			return
		}
	}
}
