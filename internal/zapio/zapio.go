package zapio

import (
	"bytes"
	"log"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Writer logs each written line through l.
type Writer struct{ L *zap.Logger }

func (w Writer) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		s := string(line)
		lvl := zapcore.InfoLevel
		switch {
		case strings.Contains(s, "[DEBUG]"), strings.Contains(s, "[TRACE]"):
			lvl = zapcore.DebugLevel
		case strings.Contains(s, "[WARN]"):
			lvl = zapcore.WarnLevel
		case strings.Contains(s, "[ERR"):
			lvl = zapcore.ErrorLevel
		}
		if ce := w.L.Check(lvl, strings.TrimSpace(stripPrefix(s))); ce != nil {
			ce.Write()
		}
	}
	return len(p), nil
}

// stripPrefix drops a leading timestamp and level tag.
func stripPrefix(s string) string {
	if i := strings.Index(s, "] "); i >= 0 && i < 40 {
		return s[i+2:]
	}
	return s
}

// StdLogger is a *log.Logger writing into l.
func StdLogger(l *zap.Logger) *log.Logger { return log.New(Writer{L: l}, "", 0) }
