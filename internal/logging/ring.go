package logging

import (
	"strings"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Ring keeps the last lines a logger wrote, for tests to show when they
// fail (a flaky cluster test without its agents' logs says only what it
// waited for).
type Ring struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
}

// NewRing returns a ring of n lines.
func NewRing(n int) *Ring { return &Ring{lines: make([]string, n)} }

// Write stores each line of p.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		r.lines[r.next] = l
		r.next = (r.next + 1) % len(r.lines)
		if r.next == 0 {
			r.full = true
		}
	}
	return len(p), nil
}

// Sync does nothing: the lines are in memory.
func (r *Ring) Sync() error { return nil }

// Lines returns the lines kept, oldest first, and empties the ring.
func (r *Ring) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	if r.full {
		out = append(out, r.lines[r.next:]...)
	}
	out = append(out, r.lines[:r.next]...)
	r.next, r.full = 0, false
	return out
}

// SetupRing installs a global logger at level that writes console lines
// into r.
func SetupRing(r *Ring, level zapcore.Level) *zap.Logger {
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
	l := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(encCfg), r, level))
	zap.ReplaceGlobals(l)
	return l
}
