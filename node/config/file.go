package config

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written as "500ms" in config files.
type Duration time.Duration

// UnmarshalJSON accepts "1.5s" or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: want e.g. 500ms or 2s", s)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration %s: want e.g. \"500ms\"", b)
	}
	*d = Duration(n)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Or is d, or def when d is not set.
func (d Duration) Or(def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return time.Duration(d)
}

// LoadConfigFile reads a JSON config file into c; flags applied later win.
func LoadConfigFile(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	// Keys as the flags name them are taken too: sizes as text
	// ("memory_limit": "8GiB"), "role" for serves, "insecure_http".
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&raw); err != nil {
		return fmt.Errorf("config file %s: %v", path, err)
	}
	if dec.More() {
		return fmt.Errorf("config file %s: more than one JSON object", path)
	}
	for _, k := range []string{"memory_limit", "disk_limit"} {
		var text string
		if v, ok := raw[k]; ok && json.Unmarshal(v, &text) == nil {
			n, err := ParseSize(text)
			if err != nil {
				return fmt.Errorf("config file %s: %s: %v", path, k, err)
			}
			raw[k], _ = json.Marshal(n)
		}
	}
	if v, ok := raw["role"]; ok {
		if _, both := raw["serves"]; both {
			return fmt.Errorf("config file %s: role and serves name the same setting: keep one", path)
		}
		raw["serves"] = v
		delete(raw, "role")
	}
	if v, ok := raw["insecure_http"]; ok {
		var on bool
		if err := json.Unmarshal(v, &on); err != nil {
			return fmt.Errorf("config file %s: insecure_http: want true or false", path)
		}
		if on {
			raw["https"], _ = json.Marshal(HTTPSOff)
		}
		delete(raw, "insecure_http")
	}
	norm, _ := json.Marshal(raw)
	strict := json.NewDecoder(strings.NewReader(string(norm)))
	strict.DisallowUnknownFields()
	if err := strict.Decode(c); err != nil {
		return fmt.Errorf("config file %s: %v", path, err)
	}
	return nil
}

// ParseSize reads a size such as 512MiB, 2GiB, 8GB or a number of bytes.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	units := []struct {
		suffix string
		mult   float64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
		{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size: want e.g. 512MiB or 2GiB", s)
	}
	return uint64(v * mult), nil
}
