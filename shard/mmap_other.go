//go:build !unix

package shard

import (
	"io"
	"os"
)

// mapFile reads f into memory where mmap is not available.
func mapFile(f *os.File, size int64) ([]byte, func() error, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, size), b); err != nil {
		return nil, nil, err
	}
	return b, func() error { return nil }, nil
}
