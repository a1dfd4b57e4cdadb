package openai_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// These tests drive the endpoint with the official Go client against a
// real scheduler on a small random-weight model.

func newClient(e *testEnv, opts ...option.RequestOption) oa.Client {
	return oa.NewClient(append([]option.RequestOption{option.WithBaseURL(e.srv.URL + "/v1/"), option.WithAPIKey("sk-test"),
		option.WithMaxRetries(0), option.WithHTTPClient(e.srv.Client())}, opts...)...)
}

// chatParams asks for maxTokens tokens at temperature (< 0: the server's
// default) after a system prompt and user.
func chatParams(user string, maxTokens int64, temperature float64) oa.ChatCompletionNewParams {
	p := oa.ChatCompletionNewParams{Model: "tiny", MaxTokens: oa.Int(maxTokens), Messages: []oa.ChatCompletionMessageParamUnion{
		oa.SystemMessage("You are a test."), oa.UserMessage(user)}}
	if temperature >= 0 {
		p.Temperature = oa.Float(temperature)
	}
	return p
}

func TestClientChat(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	p := chatParams("Hello there", 12, 0)
	res, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.ID, "chatcmpl-") || res.Object != "chat.completion" || res.Model != "tiny" || res.Created == 0 {
		t.Fatalf("envelope: %+v", res)
	}
	if len(res.Choices) != 1 || res.Choices[0].FinishReason != "length" || res.Choices[0].Message.Role != "assistant" || res.Choices[0].Message.Content == "" {
		t.Fatalf("choices: %+v", res.Choices)
	}
	u := res.Usage
	if u.CompletionTokens != 12 || u.PromptTokens == 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v", u)
	}
	greedy := res.Choices[0].Message.Content

	// The same request streamed, with usage: the text is the same, the
	// last chunk carries usage and no choices.
	s := c.Chat.Completions.NewStreaming(ctx, oa.ChatCompletionNewParams{Model: p.Model, Messages: p.Messages, MaxTokens: p.MaxTokens,
		Temperature: p.Temperature, StreamOptions: oa.ChatCompletionStreamOptionsParam{IncludeUsage: oa.Bool(true)}})
	var text strings.Builder
	var chunks int
	var finish string
	var last oa.ChatCompletionChunk
	for s.Next() {
		ch := s.Current()
		chunks++
		if ch.Object != "chat.completion.chunk" || ch.ID == "" {
			t.Fatalf("chunk envelope %+v", ch)
		}
		for _, choice := range ch.Choices {
			text.WriteString(choice.Delta.Content)
			if choice.FinishReason != "" {
				finish = choice.FinishReason
			}
		}
		last = ch
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != greedy || finish != "length" {
		t.Fatalf("streamed %q (finish %q), non-streamed %q", text.String(), finish, greedy)
	}
	if len(last.Choices) != 0 || last.Usage.CompletionTokens != 12 || last.Usage.TotalTokens != u.TotalTokens || chunks < 3 {
		t.Fatalf("last chunk %+v after %d chunks", last, chunks)
	}
	// The repeated prompt's full blocks (16 positions) came from the prefix
	// cache; the block with its last token was computed.
	if got, want := last.Usage.PromptTokensDetails.CachedTokens, (u.PromptTokens-1)/16*16; u.PromptTokensDetails.CachedTokens != 0 || got != want || want == 0 {
		t.Fatalf("cached prompt tokens %d then %d, want 0 then %d (prompt of %d)", u.PromptTokensDetails.CachedTokens, got, want, u.PromptTokens)
	}
}

func TestClientCompletionsAndModels(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	p := oa.CompletionNewParams{Model: "tiny", Prompt: oa.CompletionNewParamsPromptUnion{OfString: oa.String("Once upon a time")},
		MaxTokens: oa.Int(10), Temperature: oa.Float(0)}
	res, err := c.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.ID, "cmpl-") || res.Object != "text_completion" || len(res.Choices) != 1 || res.Choices[0].Text == "" ||
		res.Choices[0].FinishReason != "length" || res.Usage.CompletionTokens != 10 ||
		res.Usage.PromptTokens != int64(len(e.tok.Encode("Once upon a time", true, true))) {
		t.Fatalf("completion %+v", res)
	}
	// Streamed: the same text.
	s := c.Completions.NewStreaming(ctx, p)
	var text strings.Builder
	for s.Next() {
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != res.Choices[0].Text {
		t.Fatalf("streamed %q, non-streamed %q", text.String(), res.Choices[0].Text)
	}
	// echo puts the prompt in front.
	echo, err := c.Completions.New(ctx, oa.CompletionNewParams{Model: "tiny", Prompt: p.Prompt, MaxTokens: p.MaxTokens, Temperature: p.Temperature, Echo: oa.Bool(true)})
	if err != nil || echo.Choices[0].Text != "Once upon a time"+res.Choices[0].Text {
		t.Fatalf("echo: %q %v", echo.Choices[0].Text, err)
	}
	// A token-id prompt works too.
	ids := e.tok.Encode("Once upon a time", true, true)
	toks := make([]int64, len(ids))
	for i, id := range ids {
		toks[i] = int64(id)
	}
	res2, err := c.Completions.New(ctx, oa.CompletionNewParams{Model: "tiny", Prompt: oa.CompletionNewParamsPromptUnion{OfArrayOfTokens: toks},
		MaxTokens: oa.Int(10), Temperature: oa.Float(0)})
	if err != nil {
		t.Fatal(err)
	}
	if res2.Choices[0].Text != res.Choices[0].Text {
		t.Fatalf("token prompt gave %q, text prompt %q", res2.Choices[0].Text, res.Choices[0].Text)
	}

	// Models.
	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "tiny" || page.Data[0].OwnedBy != "test" || page.Data[0].Created != 1700000000 || page.Data[0].Object != "model" {
		t.Fatalf("models %+v", page.Data)
	}
	if !strings.Contains(page.Data[0].RawJSON(), `"shoal.chat_template":"model"`) {
		t.Fatalf("model entry %s", page.Data[0].RawJSON())
	}
	m, err := c.Models.Get(ctx, "tiny")
	if err != nil || m.ID != "tiny" {
		t.Fatalf("get: %v %+v", err, m)
	}
	if _, err := c.Models.Get(ctx, "nope"); err == nil {
		t.Fatal("unknown model found")
	} else if ae, ok := err.(*oa.Error); !ok || ae.StatusCode != http.StatusNotFound || ae.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestFallbackTemplate serves a model without a chat template: chat uses
// ChatML and /v1/models says so.
func TestFallbackTemplate(t *testing.T) {
	e := newEnv(t, envOptions{noTemplate: true, neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.Data[0].RawJSON(), `"shoal.chat_template":"fallback-chatml"`) {
		t.Fatalf("model entry %s", page.Data[0].RawJSON())
	}
	p := chatParams("Hi", 2, -1)
	res, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]int32{e.tok.BOS()}, e.tok.Encode("<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", false, true)...)
	if res.Usage.PromptTokens != int64(len(want)) {
		t.Fatalf("prompt tokens %d, want %d", res.Usage.PromptTokens, len(want))
	}
}

func TestClientLogprobs(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	p := chatParams("Tell me something", 10, 0)
	p.Logprobs = oa.Bool(true)
	p.TopLogprobs = oa.Int(3)
	res, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	lp := res.Choices[0].Logprobs.Content
	if len(lp) != 10 {
		t.Fatalf("%d logprob entries for 10 tokens", len(lp))
	}
	var raw []byte
	for i, tl := range lp {
		if len(tl.TopLogprobs) != 3 || tl.Logprob > 0 {
			t.Fatalf("token %d: %+v", i, tl)
		}
		// Greedy: the chosen token is the most likely one.
		if tl.TopLogprobs[0].Logprob != tl.Logprob || tl.TopLogprobs[0].Token != tl.Token {
			t.Fatalf("token %d: chosen %q %v, top %+v", i, tl.Token, tl.Logprob, tl.TopLogprobs[0])
		}
		if !(tl.TopLogprobs[0].Logprob >= tl.TopLogprobs[1].Logprob && tl.TopLogprobs[1].Logprob >= tl.TopLogprobs[2].Logprob) {
			t.Fatalf("token %d: top not ordered %+v", i, tl.TopLogprobs)
		}
		for _, b := range tl.Bytes {
			raw = append(raw, byte(b))
		}
	}
	// The tokens' bytes spell the answer.
	if got := strings.ToValidUTF8(string(raw), "\uFFFD"); utf8.Valid(raw) && got != res.Choices[0].Message.Content {
		t.Fatalf("bytes spell %q, content %q", got, res.Choices[0].Message.Content)
	}

	// Streamed chat logprobs arrive with their tokens.
	s := c.Chat.Completions.NewStreaming(ctx, p)
	var n int
	for s.Next() {
		for _, ch := range s.Current().Choices {
			n += len(ch.Logprobs.Content)
		}
	}
	if err := s.Err(); err != nil || n != 10 {
		t.Fatalf("streamed %d logprob entries, err %v", n, err)
	}

	// Completions shape.
	prompt := "The weather today"
	cres, err := c.Completions.New(ctx, oa.CompletionNewParams{Model: "tiny", Prompt: oa.CompletionNewParamsPromptUnion{OfString: oa.String(prompt)},
		MaxTokens: oa.Int(8), Temperature: oa.Float(0), Logprobs: oa.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	cl := cres.Choices[0].Logprobs
	if len(cl.Tokens) != 8 || len(cl.TokenLogprobs) != 8 || len(cl.TopLogprobs) != 8 || len(cl.TextOffset) != 8 {
		t.Fatalf("completion logprobs %+v", cl)
	}
	if cl.TextOffset[0] != int64(utf8.RuneCountInString(prompt)) {
		t.Fatalf("first text_offset %d, prompt has %d characters", cl.TextOffset[0], utf8.RuneCountInString(prompt))
	}
	for i := range cl.Tokens {
		if cl.TokenLogprobs[i] > 0 || len(cl.TopLogprobs[i]) == 0 || len(cl.TopLogprobs[i]) > 2 {
			t.Fatalf("token %d: %q %v %v", i, cl.Tokens[i], cl.TokenLogprobs[i], cl.TopLogprobs[i])
		}
		if i > 0 && cl.TextOffset[i] < cl.TextOffset[i-1] {
			t.Fatalf("text_offset decreases: %v", cl.TextOffset)
		}
		best := cl.TopLogprobs[i][cl.Tokens[i]]
		if best != cl.TokenLogprobs[i] {
			t.Fatalf("token %d %q: logprob %v, top %v", i, cl.Tokens[i], cl.TokenLogprobs[i], cl.TopLogprobs[i])
		}
	}
}

// TestClientStop finds a stop string that greedy decoding really produces,
// spanning a token boundary, and checks the answer is cut before it.
func TestClientStop(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	p := chatParams("Write a long story", 48, 0)
	p.Logprobs = oa.Bool(true)
	res, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	full := res.Choices[0].Message.Content
	// Find two adjacent tokens after the first few whose texts are plain
	// printable ASCII, and take the end of one and the start of the next.
	var stop string
	toks := res.Choices[0].Logprobs.Content
	for i := 0; i+1 < len(toks); i++ {
		a, b := toks[i].Token, toks[i+1].Token
		if i < 3 || !printable(a) || !printable(b) || a == "" || b == "" {
			continue
		}
		stop = a[len(a)-1:] + b[:1]
		break
	}
	if stop == "" {
		t.Fatalf("no two printable tokens in %q", full)
	}
	cut := strings.Index(full, stop)
	if cut < 0 {
		t.Fatalf("stop %q not in %q", stop, full)
	}
	t.Logf("greedy output %q, stop %q at %d", full, stop, cut)
	p.Stop = oa.ChatCompletionNewParamsStopUnion{OfString: oa.String(stop)}
	res2, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := res2.Choices[0].Message.Content; got != full[:cut] || res2.Choices[0].FinishReason != "stop" {
		t.Fatalf("with stop %q: %q (finish %q), want %q", stop, got, res2.Choices[0].FinishReason, full[:cut])
	}
	if res2.Usage.CompletionTokens >= 48 {
		t.Fatalf("generation went on after the stop string: %+v", res2.Usage)
	}
	// Streamed, with a second stop string that never occurs: no chunk
	// carries any part of the stop string.
	s := c.Chat.Completions.NewStreaming(ctx, oa.ChatCompletionNewParams{Model: p.Model, Messages: p.Messages, MaxTokens: p.MaxTokens,
		Temperature: p.Temperature, Stop: oa.ChatCompletionNewParamsStopUnion{OfStringArray: []string{"\x00never\x00", stop}}})
	var text strings.Builder
	var finish string
	for s.Next() {
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != full[:cut] || finish != "stop" {
		t.Fatalf("streamed with stop: %q (finish %q), want %q", text.String(), finish, full[:cut])
	}
	// The same on /v1/completions.
	cp := oa.CompletionNewParams{Model: "tiny", Prompt: oa.CompletionNewParamsPromptUnion{OfString: oa.String("Write")}, MaxTokens: oa.Int(48), Temperature: oa.Float(0)}
	cres, err := c.Completions.New(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	ctext := cres.Choices[0].Text
	if len(ctext) < 8 {
		t.Fatalf("short completion %q", ctext)
	}
	cstop := ""
	for i := 4; i+2 <= len(ctext); i++ {
		if printable(ctext[i : i+2]) {
			cstop = ctext[i : i+2]
			break
		}
	}
	if cstop == "" {
		t.Skipf("no printable pair in %q", ctext)
	}
	ccut := strings.Index(ctext, cstop)
	cp.Stop = oa.CompletionNewParamsStopUnion{OfStringArray: []string{cstop}}
	cres2, err := c.Completions.New(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	if cres2.Choices[0].Text != ctext[:ccut] || cres2.Choices[0].FinishReason != "stop" {
		t.Fatalf("completions with stop %q: %q (finish %q), want %q", cstop, cres2.Choices[0].Text, cres2.Choices[0].FinishReason, ctext[:ccut])
	}
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func TestClientSeed(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true})
	c := newClient(e)
	ctx := context.Background()
	run := func(seed int64) string {
		p := chatParams("Say something random", 24, 1)
		p.Seed = oa.Int(seed)
		res, err := c.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return res.Choices[0].Message.Content
	}
	a, b, d := run(42), run(42), run(43)
	if a != b {
		t.Fatalf("same seed, different text: %q vs %q", a, b)
	}
	if a == d {
		t.Fatalf("seeds 42 and 43 gave the same 24 tokens: %q", a)
	}
}

// TestConcurrentChats runs greedy requests at once (sharing the batch and
// the compiled template) and checks each answers what it answers alone.
func TestConcurrentChats(t *testing.T) {
	e := newEnv(t, envOptions{neverEOG: true, cacheTokens: 2048})
	c := newClient(e)
	ctx := context.Background()
	const n = 6
	params := func(i int) oa.ChatCompletionNewParams {
		p := chatParams(strings.Repeat("question ", i+1), 10, 0)
		return p
	}
	alone := make([]string, n)
	for i := range alone {
		res, err := c.Chat.Completions.New(ctx, params(i))
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = res.Choices[0].Message.Content
	}
	got := make([]string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			if i%2 == 0 {
				res, err := c.Chat.Completions.New(ctx, params(i))
				if err == nil {
					got[i] = res.Choices[0].Message.Content
				}
				errs <- err
				return
			}
			s := c.Chat.Completions.NewStreaming(ctx, params(i))
			var b strings.Builder
			for s.Next() {
				for _, ch := range s.Current().Choices {
					b.WriteString(ch.Delta.Content)
				}
			}
			got[i] = b.String()
			errs <- s.Err()
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i := range got {
		if got[i] != alone[i] {
			t.Errorf("request %d: concurrent %q, alone %q", i, got[i], alone[i])
		}
	}
}
