package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"shoal/engine/device"
	"shoal/engine/device/vulkan"
)

// chooseDevice resolves --device and says on stderr what runs the layers.
func chooseDevice(cmd *cobra.Command, spec string) (device.Device, error) {
	d, line, err := vulkan.Choose(spec)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "device: %s\n", line)
	return d, nil
}
