package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"shoal/engine/quant"
)

const oracleDir = "../../../shared/oracle"

type oracleCase struct {
	name   string
	model  string
	tokens []int32
	nVocab int
	logits []float32
}

func loadOracle(t *testing.T) []oracleCase {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(oracleDir, "*", "tokens.json"))
	if len(dirs) == 0 {
		t.Skip("../shared/oracle absent")
	}
	var cases []oracleCase
	for _, tj := range dirs {
		dir := filepath.Dir(tj)
		c := oracleCase{name: filepath.Base(dir), model: filepath.Join(dir, "model.gguf")}
		if _, err := os.Stat(c.model); err != nil {
			t.Logf("%s: no model.gguf (run ../shared/oracle/materialize)", c.name)
			continue
		}
		raw, err := os.ReadFile(tj)
		if err != nil {
			t.Fatal(err)
		}
		var js struct {
			Tokens []int32 `json:"tokens"`
			NVocab int     `json:"n_vocab"`
		}
		if err := json.Unmarshal(raw, &js); err != nil {
			t.Fatalf("%s: %v", tj, err)
		}
		c.tokens, c.nVocab = js.Tokens, js.NVocab
		lb, err := os.ReadFile(filepath.Join(dir, "logits.f32"))
		if err != nil {
			t.Fatal(err)
		}
		c.logits = make([]float32, len(lb)/4)
		for i := range c.logits {
			c.logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(lb[4*i:]))
		}
		if len(c.logits) != len(c.tokens)*c.nVocab {
			t.Fatalf("%s: logits.f32 has %d values, want %d", c.name, len(c.logits), len(c.tokens)*c.nVocab)
		}
		cases = append(cases, c)
	}
	return cases
}

// metrics compares test logits with reference logits row by row.
type metrics struct{ maxAbs, nrmse, meanKL, maxKL float64 }

func compare(ref, got []float32, nVocab int) metrics {
	var m metrics
	var sumSq, sum, sumRef2 float64
	for i := range ref {
		d := float64(got[i]) - float64(ref[i])
		m.maxAbs = math.Max(m.maxAbs, math.Abs(d))
		sumSq += d * d
		sum += float64(ref[i])
		sumRef2 += float64(ref[i]) * float64(ref[i])
	}
	n := float64(len(ref))
	mean := sum / n
	std := math.Sqrt(sumRef2/n - mean*mean)
	m.nrmse = math.Sqrt(sumSq/n) / std
	rows := len(ref) / nVocab
	for r := 0; r < rows; r++ {
		kl := klDiv(ref[r*nVocab:(r+1)*nVocab], got[r*nVocab:(r+1)*nVocab])
		m.meanKL += kl / float64(rows)
		m.maxKL = math.Max(m.maxKL, kl)
	}
	return m
}

func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - math.Log(s)
	}
	return out
}

func klDiv(p, q []float32) float64 {
	lp, lq := logSoftmax(p), logSoftmax(q)
	var kl float64
	for i := range lp {
		kl += math.Exp(lp[i]) * (lp[i] - lq[i])
	}
	return kl
}

func isFloatModel(m *Model) bool {
	for _, ti := range m.File.Tensors {
		switch ti.Type {
		case quant.F32, quant.F16, quant.BF16:
		default:
			return false
		}
	}
	return true
}

func TestOracle(t *testing.T) {
	cases := loadOracle(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Open(c.model)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.NVocab != c.nVocab {
				t.Fatalf("n_vocab %d, oracle says %d", m.NVocab, c.nVocab)
			}
			r, err := NewRunner(m, Options{Threads: 2, CacheTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got, err := r.Prompt(0, c.tokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			mt := compare(c.logits, got, c.nVocab)
			float := isFloatModel(m)
			t.Logf("ORACLE %-14s float=%-5v %s", c.name, float, fmtMetrics(mt))
			if err := mt.tolerance(float); err != nil {
				t.Error(err)
			}
		})
	}
}

func fmtMetrics(m metrics) string {
	return fmt.Sprintf("max|Δ|=%.4f nrmse=%.2e meanKL=%.2e maxKL=%.2e", m.maxAbs, m.nrmse, m.meanKL, m.maxKL)
}

// tolerance checks m against the bounds the oracle's README suggests for
// legitimate differences from llama.cpp.
func (m metrics) tolerance(float bool) error {
	if float {
		if m.maxAbs > 0.02 || m.nrmse > 2e-3 {
			return fmt.Errorf("float model outside tolerance (max|Δ| ≤ 0.02, nrmse ≤ 2e-3)")
		}
	} else if m.nrmse > 0.07 || m.meanKL > 0.005 || m.maxKL > 0.01 || m.maxAbs > 0.75 {
		return fmt.Errorf("quantized model outside tolerance (nrmse ≤ 0.07, mean KL ≤ 0.005, max KL ≤ 0.01, max|Δ| ≤ 0.75)")
	}
	return nil
}
