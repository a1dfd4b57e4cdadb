package node

import "shoal/node/config"

// An agent's configuration is node/config's; node names it for the
// callers of Start.
type (
	// Config of an agent (config.Config).
	Config = config.Config
	// Tuning holds timers (config.Tuning).
	Tuning = config.Tuning
	// Duration is a time.Duration written as "500ms" (config.Duration).
	Duration = config.Duration
	// ModelConfig is a model given with --model (config.ModelConfig).
	ModelConfig = config.ModelConfig
)

// Modes of Config.HTTPS and Config.NetTelemetry, and the port of a --join
// address without one (node/config's).
const (
	HTTPSAuto        = config.HTTPSAuto
	HTTPSOn          = config.HTTPSOn
	HTTPSOff         = config.HTTPSOff
	NetTelemetryAuto = config.NetTelemetryAuto
	NetTelemetryEBPF = config.NetTelemetryEBPF
	NetTelemetryQUIC = config.NetTelemetryQUIC
	DefaultQUICPort  = config.DefaultQUICPort
)

// LoadConfigFile reads a JSON config file into c (config.LoadConfigFile).
func LoadConfigFile(path string, c *Config) error { return config.LoadConfigFile(path, c) }

// ParseSize reads a size such as 512MiB or 2GiB (config.ParseSize).
func ParseSize(s string) (uint64, error) { return config.ParseSize(s) }

// DefaultName is the name of an agent started without --name
// (config.DefaultName).
func DefaultName() string { return config.DefaultName() }
