package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"shoal/api"
	"shoal/engine/enginetest"
	"shoal/engine/tokenizer"
	"shoal/node"
	"shoal/node/nodetest"
)

// endlessModel makes the agent serve modelName without an end-of-sequence
// token: a greedy answer then runs on to max_tokens, long enough to be
// stopped from the page. Its context holds stopLong tokens: at the
// thousands of tokens a second the tiny model decodes, an answer of 1,500
// once ended before the test clicked Stop.
func endlessModel(t *testing.T) func(*node.Config) {
	return func(c *node.Config) {
		v, err := tokenizer.ByteLevelVocab(300)
		if err != nil {
			t.Fatal(err)
		}
		v.Pad(512)
		v.EOS = tokenizer.NoToken
		spec := enginetest.Tiny
		spec.Name = modelName
		spec.Tokenizer = v.KVs()
		c.Models[0].Path = enginetest.Write(t, t.TempDir(), spec)
		c.Models[0].Ctx = stopLong + 512
	}
}

// stopLong is the max_tokens of the answer the chat test stops.
const stopLong = 40000

// browserFor is headless with a longer deadline: the chat test streams
// several answers.
func browserFor(t *testing.T, chrome string, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(bcancel)
	return bctx
}

// TestChatInBrowser drives the chat page in headless Chromium: a login
// link (#key=KEY) signs the dashboard in and leaves the address bar
// without the key; the chat lists the model, streams an answer that grows
// chunk by chunk and equals the server's own greedy answer, shows its
// token count and speed; Stop ends a long generation (no more text, the
// page ready again, the agent's request ended as cancelled) and keeps the
// partial answer; a server error is shown; the markdown renderer escapes
// HTML; and an inference key, which cannot read the cluster's status, is
// told so on the dashboard and can still chat.
func TestChatInBrowser(t *testing.T) {
	chrome := chromePath()
	if chrome == "" {
		t.Skip("no Chromium binary found (Debian: apt-get install chromium; or set SHOAL_CHROME): chat browser test skipped")
	}
	agent, base := startAgentWith(t, endlessModel(t))
	bctx := browserFor(t, chrome, 150*time.Second)
	poll := func(expr string, d time.Duration) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(d))
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	body := func() string { s, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("body"))); return s }

	// The login link signs the dashboard in.
	err := chromedp.Do(bctx,
		chromedp.Navigate(base+"/#key="+nodetest.Secret),
		poll(`!!document.querySelector('#nodes tr[data-node="`+nodeName+`"]')`, 20*time.Second),
	)
	if err != nil {
		t.Fatalf("the dashboard opened with a login link did not fill: %v\npage:\n%s", err, body())
	}
	if got := eval(`JSON.stringify([location.href, location.hash, localStorage.getItem('shoal.apiKey'), String(document.getElementById('key-dialog').hidden)])`); got != `["`+base+`/","","`+nodetest.Secret+`","true"]` {
		t.Fatalf("after the login link: [href, hash, stored key, dialog hidden] = %s", got)
	}

	// The chat page, through the dashboard's link.
	lastAnswer := `[...document.querySelectorAll('#log article.assistant')].pop()`
	err = chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`nav a[href="/dashboard/chat"]`)),
		chromedp.WaitReady(chromedp.ID("chat-form")),
		poll(`location.pathname === '/dashboard/chat' && document.body.dataset.state === 'ready' && !!document.querySelector('#model option[value="`+modelName+`"]')`, 15*time.Second),
	)
	if err != nil {
		t.Fatalf("the chat page did not list the model: %v\npage:\n%s", err, body())
	}
	if hidden := eval(`String(document.getElementById('key-dialog').hidden)`); hidden != "true" {
		t.Fatal("the chat page asks for a key the login link gave")
	}

	// Enter sends, Shift+Enter is a new line.
	err = chromedp.Do(bctx,
		chromedp.SetValue(chromedp.ID("model"), modelName),
		chromedp.SetValue(chromedp.ID("temperature"), "0"),
		chromedp.SetValue(chromedp.ID("max-tokens"), "48"),
		chromedp.SendKeys(chromedp.ID("prompt"), "hi"),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if v := eval(`JSON.stringify([document.getElementById('prompt').value, document.querySelectorAll('#log article').length])`); v != `["hi\n",0]` {
		t.Fatalf("after Shift+Enter: [prompt, messages] = %s, want a new line and nothing sent", v)
	}

	// A streamed answer: every change to the answer is recorded.
	eval(`(() => {
		window.seen = [];
		new MutationObserver(() => {
			const a = ` + lastAnswer + `;
			if (a) window.seen.push({state: a.dataset.state || '', chars: Number(a.dataset.chars || 0)});
		}).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true, attributes: true});
		// The page's own states, recorded as they change: a fast answer
		// (48 tokens at 1,000 tok/s) is streamed and done between two
		// polls of the page.
		window.pageStates = [];
		new MutationObserver(() => window.pageStates.push(document.body.dataset.state || '')).
			observe(document.body, {attributes: true, attributeFilter: ['data-state']});
		return '';
	})()`)
	err = chromedp.Do(bctx,
		chromedp.SetValue(chromedp.ID("prompt"), "hi"),
		chromedp.Focus(chromedp.ID("prompt")),
		chromedp.KeyEvent(kb.Enter),
		poll(`document.body.dataset.state === 'ready' && (`+lastAnswer+` || {dataset: {}}).dataset.state === 'done'`, 60*time.Second),
	)
	if err != nil {
		t.Fatalf("no streamed answer: %v\npage:\n%s", err, body())
	}
	if states := eval(`JSON.stringify(window.pageStates)`); !strings.Contains(states, `"streaming"`) {
		t.Fatalf("the page never showed it was streaming: its states %s", states)
	}
	var obs []answerSeen
	if err := json.Unmarshal([]byte(eval(`JSON.stringify(window.seen)`)), &obs); err != nil {
		t.Fatal(err)
	}
	var convo []struct{ Role, Content string }
	if err := json.Unmarshal([]byte(eval(`JSON.stringify(shoalChat.messages())`)), &convo); err != nil {
		t.Fatal(err)
	}
	if len(convo) != 2 || convo[0].Role != "user" || convo[0].Content != "hi" || convo[1].Role != "assistant" || convo[1].Content == "" {
		t.Fatalf("conversation %+v, want the question and an answer", convo)
	}
	answer := convo[1].Content
	growing := grew(t, obs)
	final := len([]rune(answer)) // JavaScript counts UTF-16 units; the same for this text unless it has astral runes
	t.Logf("answer grew through %d lengths %v to %d characters", len(growing), growing, final)
	// 48 tokens may all come in one read of the stream (a loaded host
	// with 2 cores did it at once): that the page shows an answer as it
	// grows is checked on the long one below.
	if len(growing) > 0 && growing[len(growing)-1] > final+1 {
		t.Errorf("streamed lengths %v exceed the final answer (%d)", growing, final)
	}
	want := chatAnswer(t, base, "hi", 48)
	if answer != want {
		t.Errorf("the streamed answer differs from the server's greedy answer:\n page %q\nserver %q", answer, want)
	}
	meta := eval(lastAnswer + `.querySelector('.meta').textContent`)
	t.Logf("answer meta: %s", meta)
	if !strings.Contains(meta, "48 tokens") || !strings.Contains(meta, "tok/s") || !strings.Contains(meta, "finish: length") {
		t.Errorf("answer meta %q lacks the token count (48, from the usage), tok/s or the finish reason", meta)
	}
	if n := eval(lastAnswer + `.querySelectorAll('.md script, .md img, .md iframe').length.toString()`); n != "0" {
		t.Errorf("the rendered answer holds %s script/img/iframe elements", n)
	}

	// A long generation, shown as it grows, then stopped.
	before := latestRequest(t, base).Seq
	err = chromedp.Do(bctx,
		chromedp.Click(chromedp.ID("new-chat")),
		poll(`document.querySelectorAll('#log article').length === 0 && shoalChat.messages().length === 0`, 5*time.Second),
		poll(`(window.seen = [], true)`, 5*time.Second),
		chromedp.SetValue(chromedp.ID("max-tokens"), strconv.Itoa(stopLong)),
		chromedp.SetValue(chromedp.ID("prompt"), "hi"),
		chromedp.Click(chromedp.ID("send")),
		poll(`Number((`+lastAnswer+` || {dataset: {}}).dataset.chunks || 0) >= 5`, 30*time.Second),
		chromedp.Click(chromedp.ID("stop")),
		poll(`document.body.dataset.state === 'ready' && `+lastAnswer+`.dataset.state === 'stopped'`, 5*time.Second),
	)
	if err != nil {
		t.Fatalf("stopping a long generation: %v\npage:\n%s", err, body())
	}
	at := eval(lastAnswer + `.dataset.chars`)
	obs = nil
	if err := json.Unmarshal([]byte(eval(`JSON.stringify(window.seen)`)), &obs); err != nil {
		t.Fatal(err)
	}
	if growing := grew(t, obs); len(growing) < 2 {
		t.Errorf("the long answer did not grow over two observations while streaming: %v", obs)
	}
	time.Sleep(1200 * time.Millisecond)
	after := eval(`JSON.stringify([` + lastAnswer + `.dataset.chars, String(document.getElementById('stop').disabled), String(document.getElementById('send').disabled), ` + lastAnswer + `.querySelector('.meta').textContent, String(shoalChat.messages().length), String(shoalChat.messages()[1].content.length)])`)
	var st []string
	if err := json.Unmarshal([]byte(after), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped at %s characters: %q", at, st[3])
	if st[0] != at {
		t.Errorf("the answer grew after Stop: %s then %s characters", at, st[0])
	}
	if st[1] != "true" || st[2] != "false" {
		t.Errorf("after Stop: stop disabled %s, send disabled %s; want the page ready", st[1], st[2])
	}
	if !strings.Contains(st[3], "stopped") {
		t.Errorf("the stopped answer's meta %q does not say so", st[3])
	}
	if st[4] != "2" || st[5] != at {
		t.Errorf("the partial answer is not kept: %s messages, answer of %s characters (shown %s)", st[4], st[5], at)
	}
	// The agent ended the request: its record says cancelled, short of
	// max_tokens, and nothing runs any more.
	var rec dashboardRecord
	nodetest.Eventually(t, 10*time.Second, "the agent to record the stopped request", func() bool {
		rec = latestRequest(t, base)
		return rec.Seq > before
	})
	t.Logf("the agent's record of the stopped request: %+v", rec)
	if rec.Endpoint != "chat.completions" || rec.FinishReason != "cancelled" || rec.GeneratedTokens >= stopLong || !rec.Stream {
		t.Errorf("the stopped request ended %q after %d tokens (stream %v), want cancelled short of %d", rec.FinishReason, rec.GeneratedTokens, rec.Stream, stopLong)
	}
	nodetest.Eventually(t, 10*time.Second, "no sequence to run on the agent", func() bool {
		return strings.Contains(getText(t, base+"/metrics"), `shoal_running_sequences{model="`+modelName+`"} 0`)
	})

	// A server error is shown, and the question goes back in the box.
	err = chromedp.Do(bctx,
		chromedp.Click(chromedp.ID("new-chat")),
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById('model'); s.append(new Option('no-such-model', 'no-such-model')); s.value = 'no-such-model'; })()`),
		chromedp.SetValue(chromedp.ID("prompt"), "hello?"),
		chromedp.Click(chromedp.ID("send")),
		poll(`document.body.dataset.state === 'ready' && !document.getElementById('chat-error').hidden`, 10*time.Second),
	)
	if err != nil {
		t.Fatalf("a server error: %v\npage:\n%s", err, body())
	}
	if got := eval(`JSON.stringify([document.getElementById('chat-error').textContent, document.getElementById('prompt').value, ` + lastAnswer + `.dataset.state])`); !strings.Contains(got, "no-such-model") || !strings.Contains(got, `"hello?","error"]`) {
		t.Errorf("after a request for an unknown model: [error, prompt, answer state] = %s", got)
	} else {
		t.Logf("server error shown: %s", got)
	}

	// An error event in the stream: the page's fetch answers with a
	// stream that fails after some text, once as the agent writes it (an
	// error object in a data line) and once as an "error" event.
	for _, ev := range []string{`data: {"error":{"message":"the engine failed","type":"server_error"}}`, `event: error\ndata: {"error":{"message":"the engine failed"}}`} {
		err = chromedp.Do(bctx,
			chromedp.Click(chromedp.ID("new-chat")),
			chromedp.Evaluate[chromedp.Void](`(() => {
				window.realFetch = window.realFetch || window.fetch;
				window.fetch = async (url, opts) => {
					if (url !== '/v1/chat/completions') return window.realFetch(url, opts);
					window.fetch = window.realFetch;
					const body = 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n: keepalive\n\n' +
						'data: {"choices":[{"index":0,"delta":{"content":"partial <b>x</b>"}}]}\n\n' + '`+ev+`' + '\n\n';
					return new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}});
				};
			})()`),
			chromedp.SetValue(chromedp.ID("model"), modelName),
			chromedp.SetValue(chromedp.ID("prompt"), "hi"),
			chromedp.Click(chromedp.ID("send")),
			poll(`document.body.dataset.state === 'ready' && `+lastAnswer+`.dataset.state === 'error'`, 10*time.Second),
		)
		if err != nil {
			t.Fatalf("a stream ending in %s: %v\npage:\n%s", ev, err, body())
		}
		got := eval(`JSON.stringify([document.getElementById('chat-error').textContent, ` + lastAnswer + `.querySelector('.md').textContent, String(` + lastAnswer + `.querySelectorAll('.md b').length), String(shoalChat.messages().length)])`)
		if got != `["the engine failed","partial <b>x</b>","0","2"]` {
			t.Errorf("a stream ending in %s: [error, answer text, <b> elements, messages kept] = %s", ev, got)
		}
	}

	// The markdown renderer escapes the model's text.
	type rendered struct {
		HTML                             string
		Imgs, Scripts, Strong, Code, Pre int
		Links                            []struct{ Href, Rel, Text string }
		Pwned                            bool
	}
	r, err := chromedp.Run(bctx, chromedp.Evaluate[rendered](`(() => {
		const html = shoalMarkdown('# Title\n<img src=x onerror="window.pwned=1"> **bold** *it* `+"`<b>code</b>`"+`\n\n`+
		"```"+`html\n<script>window.pwned=2</script>\n`+"```"+`\n- [a link](https://example.com/a_b) and [bad](javascript:window.pwned=3)\n- two');
		const d = document.createElement('div');
		d.innerHTML = html;
		document.body.append(d);
		const n = (s) => d.querySelectorAll(s).length;
		return {html, imgs: n('img'), scripts: n('script'), strong: n('strong'), code: n('code'), pre: n('pre'),
			links: [...d.querySelectorAll('a')].map((a) => ({href: a.getAttribute('href'), rel: a.rel, text: a.textContent})),
			pwned: !!window.pwned};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rendered: %s", r.HTML)
	if r.Imgs != 0 || r.Scripts != 0 || r.Pwned || !strings.Contains(r.HTML, "&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;") ||
		!strings.Contains(r.HTML, "<code>&lt;b&gt;code&lt;/b&gt;</code>") || !strings.Contains(r.HTML, "&lt;script&gt;") {
		t.Errorf("the renderer let HTML through: %d img, %d script, ran %v:\n%s", r.Imgs, r.Scripts, r.Pwned, r.HTML)
	}
	if r.Strong != 1 || r.Code != 2 || r.Pre != 1 || !strings.Contains(r.HTML, "<h1>Title</h1>") || !strings.Contains(r.HTML, "<li>") {
		t.Errorf("the renderer missed markdown (strong %d, code %d, pre %d):\n%s", r.Strong, r.Code, r.Pre, r.HTML)
	}
	if len(r.Links) != 1 || r.Links[0].Href != "https://example.com/a_b" || !strings.Contains(r.Links[0].Rel, "noopener") {
		t.Errorf("links %+v, want only the https one, with rel=noopener", r.Links)
	}

	// An inference key: the dashboard says it cannot read the cluster's
	// status; the chat, opened with its own login link, works.
	tok, err := api.NewClient(agent.HTTPAddr(), nodetest.Secret).CreateToken(context.Background(), api.TokenRequest{Kind: api.TokenInference})
	if err != nil {
		t.Fatal(err)
	}
	err = chromedp.Do(bctx,
		chromedp.Navigate(base+"/#key="+tok.Secret),
		poll(`!document.getElementById('limited').hidden && !!document.querySelector('#models tr[data-model="`+modelName+`"]')`, 15*time.Second),
	)
	if err != nil {
		t.Fatalf("the dashboard with an inference key: %v\npage:\n%s", err, body())
	}
	if got := eval(`JSON.stringify([location.hash, String(document.getElementById('key-dialog').hidden), document.getElementById('error').hidden ? '' : document.getElementById('error').textContent])`); got != `["","true",""]` {
		t.Errorf("dashboard with an inference key: [hash, dialog hidden, error] = %s", got)
	}
	t.Logf("inference key on the dashboard: %s", eval(`document.getElementById('limited').textContent.replace(/\s+/g, ' ')`))
	err = chromedp.Do(bctx,
		chromedp.Evaluate[chromedp.Void](`localStorage.clear()`),
		chromedp.Navigate(base+"/dashboard/chat?max_tokens=8#key="+tok.Secret),
		poll(`document.body.dataset.state === 'ready' && !!document.querySelector('#model option[value="`+modelName+`"]')`, 15*time.Second),
		chromedp.SetValue(chromedp.ID("prompt"), "hi"),
		chromedp.Click(chromedp.ID("send")),
		poll(`document.body.dataset.state === 'ready' && (`+lastAnswer+` || {dataset: {}}).dataset.state === 'done'`, 30*time.Second),
	)
	if err != nil {
		t.Fatalf("chat with an inference key: %v\npage:\n%s", err, body())
	}
	if got := eval(`JSON.stringify([location.href, localStorage.getItem('shoal.apiKey'), ` + lastAnswer + `.querySelector('.meta').textContent])`); !strings.HasPrefix(got, `["`+base+`/dashboard/chat?max_tokens=8","`+tok.Secret+`","8 tokens`) {
		t.Errorf("chat with an inference key: [href, stored key, meta] = %s", got)
	}
}

// chatAnswer asks the agent for a greedy non-streamed answer to one user
// message.
func chatAnswer(t *testing.T, base, prompt string, maxTokens int) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": modelName, "messages": []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens, "temperature": 0})
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+nodetest.Secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("chat completion: %d %s", resp.StatusCode, raw)
	}
	var c struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(raw, &c); err != nil || len(c.Choices) == 0 {
		t.Fatalf("chat completion %s: %v", raw, err)
	}
	return c.Choices[0].Message.Content
}

type dashboardRecord struct {
	Seq             uint64 `json:"seq"`
	Endpoint        string `json:"endpoint"`
	FinishReason    string `json:"finish_reason"`
	GeneratedTokens int    `json:"generated_tokens"`
	Stream          bool   `json:"stream"`
}

// latestRequest is the newest of the agent's recent requests.
func latestRequest(t *testing.T, base string) dashboardRecord {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/dashboard/api/requests", nil)
	req.Header.Set("Authorization", "Bearer "+nodetest.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Requests []dashboardRecord }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Requests) == 0 {
		return dashboardRecord{}
	}
	return out.Requests[0]
}

// answerSeen is the last answer's state and length at a change of the page.
type answerSeen struct {
	State string
	Chars int
}

// grew is the lengths an answer was seen with while streaming, growing; an
// answer that shrank is an error.
func grew(t *testing.T, obs []answerSeen) []int {
	t.Helper()
	var growing []int
	for _, o := range obs {
		if o.State != "streaming" || o.Chars == 0 {
			continue
		}
		if n := len(growing); n > 0 && o.Chars < growing[n-1] {
			t.Errorf("the answer shrank while streaming: %v", obs)
		}
		if n := len(growing); n == 0 || o.Chars > growing[n-1] {
			growing = append(growing, o.Chars)
		}
	}
	return growing
}
