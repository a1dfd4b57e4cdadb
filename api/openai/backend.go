package openai

import "sync"

// Backend is what the endpoint serves: the node provides it.
type Backend interface {
	Models() []*Model
	Model(name string) (*Model, bool)
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
