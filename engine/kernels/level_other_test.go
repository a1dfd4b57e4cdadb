//go:build !(amd64 && !noasm && gc) && !(arm64 && !noasm && gc)

package kernels

func expectedLevel() string { return "generic" }
