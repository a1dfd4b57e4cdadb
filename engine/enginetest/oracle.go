package enginetest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// OracleCase is one case of ../shared/oracle: a model, a prompt and
// llama.cpp's logits for every position of it.
type OracleCase struct {
	Name   string
	Dir    string // the case's folder
	Model  string // path of model.gguf
	Tokens []int32
	NVocab int
	Logits []float32 // [len(Tokens)][NVocab]
}

// OracleDir is ../shared/oracle beside the module's root, found from the
// test's working folder; "" when it is absent.
func OracleDir() string {
	dir := moduleRoot()
	if dir == "" {
		return ""
	}
	o := filepath.Join(dir, "..", "shared", "oracle")
	if _, err := os.Stat(o); err != nil {
		return ""
	}
	return o
}

// moduleRoot is the folder of go.mod above the working folder ("" when
// there is none).
func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

var materialize sync.Once

// OracleCases lists the oracle cases whose model is present, after running
// the oracle's materialize script once (it writes the models kept as
// recipes, where the folder is writable); without ../shared the test is
// skipped.
func OracleCases(t testing.TB) []OracleCase {
	t.Helper()
	cases := oracleCases(t)
	if cases == nil {
		t.Skip("../shared/oracle absent")
	}
	return cases
}

// oracleCases is OracleCases, nil without ../shared.
func oracleCases(t testing.TB) []OracleCase {
	t.Helper()
	dir := OracleDir()
	tjs, _ := filepath.Glob(filepath.Join(dir, "*", "tokens.json"))
	if dir == "" || len(tjs) == 0 {
		return nil
	}
	materialize.Do(func() {
		for _, tj := range tjs {
			if _, err := os.Stat(filepath.Join(filepath.Dir(tj), "model.gguf")); err != nil {
				out, err := exec.Command(filepath.Join(dir, "materialize")).CombinedOutput()
				t.Logf("materialize: %s %v", out, err)
				return
			}
		}
	})
	cases := []OracleCase{}
	for _, tj := range tjs {
		c, err := ReadCase(filepath.Dir(tj))
		if os.IsNotExist(err) {
			t.Logf("%s: no model.gguf (run ../shared/oracle/materialize)", filepath.Base(filepath.Dir(tj)))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, c)
	}
	return cases
}

// ReadCase reads the oracle case in dir (model.gguf, tokens.json, logits.f32).
func ReadCase(dir string) (OracleCase, error) {
	return readCaseAt(dir, filepath.Join(dir, "model.gguf"))
}

// readCaseAt reads case dir with its model at model ("": not yet written).
func readCaseAt(dir, model string) (OracleCase, error) {
	c := OracleCase{Name: filepath.Base(dir), Dir: dir, Model: model}
	if model != "" {
		if _, err := os.Stat(c.Model); err != nil {
			return c, err
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokens.json"))
	if err != nil {
		return c, err
	}
	var js struct {
		Tokens []int32 `json:"tokens"`
		NVocab int     `json:"n_vocab"`
	}
	if err := json.Unmarshal(raw, &js); err != nil {
		return c, &os.PathError{Op: "parse", Path: filepath.Join(dir, "tokens.json"), Err: err}
	}
	c.Tokens, c.NVocab = js.Tokens, js.NVocab
	lb, err := os.ReadFile(filepath.Join(dir, "logits.f32"))
	if err != nil {
		return c, err
	}
	c.Logits = floats(lb)
	if len(c.Logits) != len(c.Tokens)*c.NVocab {
		return c, &os.PathError{Op: "read", Path: filepath.Join(dir, "logits.f32"), Err: errLogitCount}
	}
	return c, nil
}

// More reads another logits file of the case, name in its folder: ok is
// false when there is none.
func (c OracleCase) More(name string) (logits []float32, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, name))
	if os.IsNotExist(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if len(b) != 4*len(c.Tokens)*c.NVocab {
		return nil, false, &os.PathError{Op: "read", Path: filepath.Join(c.Dir, name), Err: errLogitCount}
	}
	return floats(b), true, nil
}

// Check applies the tolerances to m, the metrics of logits computed for c
// (float: the float model's), widened to llama.cpp's own variation on c
// where the case keeps it: flash-attn.f32, llama.cpp's logits with flash
// attention on. A case whose weights make large activations (gpt-oss-f16's
// std 0.1, there to reach the SwiGLU's clamp) moves by more than the float
// tolerances under arithmetic that is just as right: llama.cpp's own two
// attention paths differ by max|Δ| 0.038 on it, and so does a
// tensor-parallel group's summation order from a single node's.
func (c OracleCase) Check(m Metrics, float bool) error {
	err := m.Check(float)
	if err == nil {
		return nil
	}
	fa, ok, ferr := c.More("flash-attn.f32")
	if ferr != nil {
		return ferr
	}
	if !ok {
		return err
	}
	own := Compare(c.Logits, fa, c.NVocab)
	if m.MaxAbs <= own.MaxAbs && m.NRMSE <= own.NRMSE && m.MaxKL <= max(own.MaxKL, 1e-4) {
		return nil
	}
	return fmt.Errorf("%w; nor within llama.cpp's own variation on the case (flash attention on: %v)", err, own)
}

// floats reads little-endian float32s.
func floats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
