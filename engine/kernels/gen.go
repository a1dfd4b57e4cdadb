package kernels

// The amd64 kernels are generated with avo (see _generate/main.go).
//go:generate sh -c "cd _generate && go run . -out ../dot_amd64.s -stubs ../dot_amd64.go -pkg kernels"
