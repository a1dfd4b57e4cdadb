package main

import (
	"fmt"
	"strconv"
	"strings"

	"shoal/engine/model"
	"shoal/engine/tokenizer"
)

// openModel loads the model and its tokenizer.
func openModel(path string) (*model.Model, *tokenizer.Tokenizer, error) {
	if path == "" {
		return nil, nil, fmt.Errorf("--model FILE is required")
	}
	m, err := model.Open(path)
	if err != nil {
		return nil, nil, err
	}
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("%s: tokenizer: %w", path, err)
	}
	return m, tok, nil
}

// parseIDs parses "1,2,3" (spaces allowed).
func parseIDs(s string) ([]int32, error) {
	var ids []int32
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token id %q is not an integer", f)
		}
		ids = append(ids, int32(v))
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no token ids given")
	}
	return ids, nil
}
