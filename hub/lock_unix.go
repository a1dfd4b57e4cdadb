//go:build unix

package hub

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// lock takes an exclusive advisory lock on f, waiting (while ctx lasts) for
// another pull of the same file, in this process or another, to finish.
func lock(ctx context.Context, f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return nil // no locking on this file system: go on without it
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
