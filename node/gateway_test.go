package node_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	tc "shoal/node/nodetest"
)

// TestCompletionViaGateway: a completion sent to an agent that does not
// serve the model is served by that agent's own OpenAI endpoint over the
// token path (its metrics count the tokens; with the HTTP path the driver's
// endpoint would): streamed, its text is the text the driver answers
// directly.
func TestCompletionViaGateway(t *testing.T) {
	_, a, front := servingElsewhere(t)
	driver := "http://" + a.HTTPAddr()
	const ask = `{"model":"tiny","prompt":"hello there","max_tokens":12,"temperature":0`
	var code int
	var body string
	tc.Eventually(t, 30*time.Second, "the driver serves tiny", func() bool {
		code, body = post(t, driver+"/v1/completions", ask+`}`)
		return code == 200
	})
	var direct struct {
		Choices []struct{ Text string }
		Usage   struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(body), &direct); err != nil || len(direct.Choices) != 1 {
		t.Fatalf("at the driver: %s", body)
	}
	req, _ := http.NewRequest("POST", front+"/v1/completions", strings.NewReader(ask+`,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+tc.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("streamed at the front: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var text strings.Builder
	events, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !done {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			done = true
		default:
			var ev struct{ Choices []struct{ Text string } }
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("event %q: %v", data, err)
			}
			events++
			for _, c := range ev.Choices {
				text.WriteString(c.Text)
			}
		}
	}
	if !done || events < 2 {
		t.Fatalf("streamed at the front: %d events, [DONE] %v", events, done)
	}
	if text.String() != direct.Choices[0].Text {
		t.Fatalf("streamed at the front %q, at the driver %q", text.String(), direct.Choices[0].Text)
	}
	// The counter moves when the stream's accounting ends, which may be a
	// moment after [DONE] reached the client (a loaded host: CI).
	var m []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, metrics := request(t, tc.Secret, "GET", front+"/metrics", "")
		m = regexp.MustCompile(`(?m)^shoal_generated_tokens_total (\d+)`).FindStringSubmatch(metrics)
		if code != 200 || m == nil {
			t.Fatalf("front metrics: %d, no shoal_generated_tokens_total", code)
		}
		if n, _ := strconv.Atoi(m[1]); n == direct.Usage.CompletionTokens || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, _ := strconv.Atoi(m[1]); n != direct.Usage.CompletionTokens || n == 0 {
		t.Fatalf("the front's endpoint generated %s tokens, the driver's answer %d: the request did not take the token path", m[1], direct.Usage.CompletionTokens)
	}
	t.Logf("%d events, %d tokens through the front's endpoint: %q", events, direct.Usage.CompletionTokens, text.String())
}
