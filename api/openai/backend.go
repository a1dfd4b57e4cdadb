package openai

import (
	"context"
	"errors"
	"net/http"
	"sync"
)

// Backend is what the endpoint serves: the node provides it.
type Backend interface {
	// Models are the models /v1/models lists.
	Models() []*Model
	// Model is the model called name as /v1/models/{id}, /v1/embeddings
	// and /tokenize see it.
	Model(name string) (*Model, bool)
	// Resolve is the model a completion names, for the request whose
	// context ctx is (it may wait for the model, or fetch what serving it
	// takes, within the request's time): ErrNoModel when there is none
	// (404), a *PassOn when another server answers the request as it
	// came, a *Refusal answered as it says; any other error is answered
	// as Submit's are.
	Resolve(ctx context.Context, name string) (*Model, error)
}

// ErrNoModel is Resolve's error for a model the backend does not have.
var ErrNoModel = errors.New("no such model")

// PassOn is Resolve's error for a model another server serves from the
// request as the client sent it: the handler, having checked the key and
// read the body (once), hands both to Serve, which answers the request.
// The handler reports nothing of it to the Observer (the server that
// answers it does).
type PassOn struct {
	// Serve answers r, whose body is body; stream is the request's
	// "stream".
	Serve func(w http.ResponseWriter, r *http.Request, body []byte, stream bool)
}

func (*PassOn) Error() string { return "the model is served by another server" }

// Refusal is an error Resolve returns to be answered as it says: the HTTP
// status, the error's type and code in the OpenAI shape, and a
// Retry-After in seconds (0: none).
type Refusal struct {
	Status     int
	Type, Code string
	Message    string
	RetryAfter int
}

func (e *Refusal) Error() string { return e.Message }

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

// Resolve is Model's model, or ErrNoModel.
func (b *StaticBackend) Resolve(_ context.Context, name string) (*Model, error) {
	if m, ok := b.Model(name); ok {
		return m, nil
	}
	return nil, ErrNoModel
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
