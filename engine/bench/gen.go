package bench

// The triad assembly is generated with avo (_generate/main.go).
//go:generate sh -c "cd _generate && go run . -out ../triad_amd64.s -pkg bench"
