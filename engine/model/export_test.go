package model

import "testing"

// Test helpers of this package for the external tests (parallel_test.go
// builds members through shard, which imports this package).

const OracleDir = oracleDir

// OracleCase is one case of ../shared/oracle.
type OracleCase struct {
	Name, Model string
	Tokens      []int32
	NVocab      int
}

// LoadOracleCases lists the oracle cases whose model is present (skipping
// the test when the oracle is absent).
func LoadOracleCases(t *testing.T) []OracleCase {
	var out []OracleCase
	for _, c := range loadOracle(t) {
		out = append(out, OracleCase{Name: c.name, Model: c.model, Tokens: c.tokens, NVocab: c.nVocab})
	}
	return out
}

// LogitDiff compares got with ref as TestOracle compares the engine with
// llama.cpp and checks the same tolerances; desc describes the metrics.
func LogitDiff(ref, got []float32, nVocab int, float bool) (desc string, err error) {
	m := compare(ref, got, nVocab)
	return fmtMetrics(m), m.tolerance(float)
}

// IsFloatModel reports whether every tensor of m's file is F32, F16 or BF16.
func IsFloatModel(m *Model) bool { return isFloatModel(m) }
