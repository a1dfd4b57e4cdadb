package kernels

// Every assembly file here is generated (make generate runs these): the
// amd64 kernels with avo (_generate/main.go), the arm64 kernels by
// _generate/arm64.
//go:generate sh -c "cd _generate && go run . -out ../dot_amd64.s -stubs ../dot_amd64.go -pkg kernels"
//go:generate sh -c "cd _generate && go run ./arm64 -out ../dot_arm64.s"
