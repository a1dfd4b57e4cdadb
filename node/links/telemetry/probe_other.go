//go:build !linux

package telemetry

import (
	"fmt"
	"runtime"
)

// Probe would count the agent's QUIC traffic with eBPF; that needs Linux,
// so here Attach always fails with ErrUnsupported and callers use the
// quic-go source (NewQUICReader).
type Probe struct{}

// Attach fails with an error wrapping ErrUnsupported: eBPF needs Linux.
func Attach(port uint16, ifaces []string) (*Probe, error) {
	return nil, errNotLinux()
}

func errNotLinux() error {
	return fmt.Errorf("%w: eBPF needs Linux, this is %s", ErrUnsupported, runtime.GOOS)
}

// AddInterface fails with ErrUnsupported.
func (p *Probe) AddInterface(name string) error { return errNotLinux() }

// Source returns "": there is no eBPF source here.
func (p *Probe) Source() string { return "" }

// Port returns 0.
func (p *Probe) Port() uint16 { return 0 }

// Interfaces returns nothing.
func (p *Probe) Interfaces() []string { return nil }

// Peers fails with ErrUnsupported.
func (p *Probe) Peers() ([]PeerStats, error) { return nil, errNotLinux() }

// Close does nothing.
func (p *Probe) Close() error { return nil }
