// Package config is an agent's configuration: Config and its Tuning, the
// --model files (ModelConfig), checking them (Validate), reading a config
// file with the keys the flags name, sizes and durations as text, and the
// default node name and --join port. It holds values and checks only: it
// must not start anything; node starts the agent a Config describes and
// names these types for its callers.
package config
