package model

import (
	"fmt"

	"shoal/engine/gguf"
)

// Model is a loaded model: hyperparameters and weight views into its file.
type Model struct {
	Config
	W    *Weights
	File *gguf.File
}

// Load binds the model in f. f must stay open while the model is used.
func Load(f *gguf.File) (*Model, error) {
	c, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", displayPath(f), err)
	}
	w, err := loadWeights(f, &c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", displayPath(f), err)
	}
	return &Model{Config: c, W: w, File: f}, nil
}

// Open maps and loads the GGUF model at path.
func Open(path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := Load(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

// Close unmaps the model file.
func (m *Model) Close() error { return m.File.Close() }

func displayPath(f *gguf.File) string {
	if p := f.Path(); p != "" {
		return p
	}
	return "model"
}
