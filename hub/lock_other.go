//go:build !unix

package hub

import (
	"context"
	"os"
)

// lock is a no-op where flock is not available: concurrent pulls of one
// file may then collide (and fail verification, not load bad bytes).
func lock(ctx context.Context, f *os.File) error { return nil }
