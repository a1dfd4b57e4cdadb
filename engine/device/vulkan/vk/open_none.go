//go:build novulkan

package vk

import "fmt"

// openLoader in a binary built with -tags novulkan (a static binary, as
// the FROM scratch container image needs: purego's dlopen makes a Linux
// binary dynamically linked) finds no Vulkan.
func openLoader() (*fns, error) {
	return nil, fmt.Errorf("%w: this binary was built without Vulkan (-tags novulkan)", ErrNoLoader)
}
