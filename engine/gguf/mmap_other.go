//go:build !unix

package gguf

import (
	"io"
	"os"
)

func mapFile(fh *os.File, size int64) ([]byte, func() error, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(fh, b); err != nil {
		return nil, nil, err
	}
	return b, func() error { return nil }, nil
}

// DropPages: the file is read into memory, not mapped; its pages stay.
func DropPages(b []byte) bool { return false }
