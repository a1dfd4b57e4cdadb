package logging

import (
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Options selects the level ("debug", "info", "warn", "error") and format
// ("console" or "json").
type Options struct {
	Level  string
	Format string
}

// New builds a logger writing to stderr.
func New(o Options) (*zap.Logger, error) {
	lvl := zapcore.InfoLevel
	if o.Level != "" {
		if err := lvl.UnmarshalText([]byte(strings.ToLower(o.Level))); err != nil {
			return nil, fmt.Errorf("log level %q: want debug, info, warn or error", o.Level)
		}
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	switch o.Format {
	case "", "console":
		encCfg.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(encCfg)
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	default:
		return nil, fmt.Errorf("log format %q: want console or json", o.Format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(os.Stderr), lvl)
	return zap.New(core), nil
}

// Setup builds the logger and installs it as zap's global logger, which
// packages reach through zap.L().
func Setup(o Options) (*zap.Logger, error) {
	l, err := New(o)
	if err != nil {
		return nil, err
	}
	zap.ReplaceGlobals(l)
	return l, nil
}
