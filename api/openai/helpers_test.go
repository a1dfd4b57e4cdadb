package openai_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/synth"
	"shoal/engine/tokenizer"
	"shoal/gateway"
	"shoal/serve"
)

var modelDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shoal-openai-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modelDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Control tokens the test vocabulary gives ChatML, in place of padding.
const (
	imStart int32 = 300
	imEnd   int32 = 301
)

var (
	modelMu    sync.Mutex
	modelFiles = map[string]string{}
)

// markerTokens are control tokens of the test vocabulary that mark tool
// calls in DeepSeek's, Kimi K2's and GLM's formats, as in their real
// vocabularies (from id 302 on).
var markerTokens = []string{"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
	"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
	"<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"}

// testVocab is the shoal byte-level vocabulary (512 tokens, BOS 256 "<|bos|>",
// EOS 257 "<|eos|>", add_bos true) with <|im_start|> and <|im_end|> as
// control tokens and <|im_end|> as end of turn, and the markerTokens.
func testVocab(t testing.TB) tokenizer.Vocab {
	v, err := tokenizer.ByteLevelVocab(300)
	if err != nil {
		t.Fatal(err)
	}
	v.Pad(512)
	v.Tokens[imStart], v.Tokens[imEnd] = "<|im_start|>", "<|im_end|>"
	v.Types[imStart], v.Types[imEnd] = tokenizer.TypeControl, tokenizer.TypeControl
	for i, m := range markerTokens {
		v.Tokens[302+i], v.Types[302+i] = m, tokenizer.TypeControl
	}
	v.EOT = imEnd
	return v
}

// modelFile writes (once per template) a small random llama model whose
// tokenizer carries chatTemplate ("" = none); noBrace takes "{" out of its
// vocabulary (a control token in its place), as small real vocabularies
// lack it.
func modelFile(t testing.TB, chatTemplate string, noBrace bool) string {
	modelMu.Lock()
	defer modelMu.Unlock()
	sum := sha256.Sum256([]byte(fmt.Sprint(chatTemplate, noBrace)))
	key := hex.EncodeToString(sum[:8])
	if p, ok := modelFiles[key]; ok {
		return p
	}
	v := testVocab(t)
	if noBrace {
		i := slices.Index(v.Tokens, "{")
		if i < 0 {
			t.Fatal("the test vocabulary has no {")
		}
		v.Tokens[i], v.Types[i] = "<|no_brace|>", tokenizer.TypeControl
	}
	kvs := v.KVs()
	if chatTemplate != "" {
		kvs = append(kvs, gguf.KV{Key: "tokenizer.chat_template", Value: chatTemplate})
	}
	spec := synth.Spec{Name: key, Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NHeadKV: 2, NFF: 128, Type: "q8_0", Seed: 11, Std: 0.1, Tokenizer: kvs}
	path := enginetest.Write(t, modelDir, spec)
	modelFiles[key] = path
	return path
}

type envOptions struct {
	name        string // model name, default "tiny"
	template    string // "" = the ChatML template below
	noTemplate  bool
	cacheTokens int // default 512
	sched       serve.Options
	handler     openai.Options
	neverEOG    bool // generate until max_tokens or the context
	noBrace     bool // a vocabulary without "{" (modelFile)
}

type testEnv struct {
	srv   *httptest.Server
	sched *serve.Scheduler
	model *openai.Model
	tok   *tokenizer.Tokenizer
}

// qwenChatML is a Qwen2-style ChatML template with a default system prompt.
const qwenChatML = `{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful assistant.<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}`

// newEnv serves one model from a real scheduler behind the handler.
func newEnv(t testing.TB, o envOptions) *testEnv {
	t.Helper()
	tpl := o.template
	if tpl == "" && !o.noTemplate {
		tpl = qwenChatML
	}
	if o.cacheTokens == 0 {
		o.cacheTokens = 512
	}
	if o.name == "" {
		o.name = "tiny"
	}
	m, err := model.Open(modelFile(t, tpl, o.noBrace))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(m.File)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: o.cacheTokens})
	if err != nil {
		t.Fatal(err)
	}
	eog := tok.IsEOG
	if o.neverEOG {
		eog = func(int32) bool { return false }
	}
	s, err := serve.New(r, eog, o.sched)
	if err != nil {
		t.Fatal(err)
	}
	ct, _ := m.File.String("tokenizer.chat_template")
	mod := gateway.NewOpenAIModel(o.name, "test", s, tok, ct)
	mod.Created = time.Unix(1700000000, 0)
	if o.handler.Log == nil {
		o.handler.Log = zap.NewNop()
	}
	srv := httptest.NewServer(openai.NewHandler(openai.NewStaticBackend(mod), o.handler))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		s.Close()
		r.Close()
		m.Close()
	})
	return &testEnv{srv: srv, sched: s, model: mod, tok: tok}
}

// post sends a JSON body (a string is sent as is).
func (e *testEnv) post(t testing.TB, path string, body any, header ...string) *http.Response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// decodeBody reads a JSON response.
func decodeBody[T any](t testing.TB, resp *http.Response) T {
	t.Helper()
	defer resp.Body.Close()
	var v T
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	return v
}

func chatBody(content string, extra map[string]any) map[string]any {
	b := map[string]any{"model": "tiny", "messages": []map[string]any{{"role": "user", "content": content}}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}
