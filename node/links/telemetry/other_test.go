//go:build !linux

package telemetry

import (
	"errors"
	"testing"
)

func TestAttachNotLinux(t *testing.T) {
	p, err := Attach(7947, []string{"en0"})
	if p != nil || !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Attach = %v, %v; want an error wrapping ErrUnsupported", p, err)
	}
}
