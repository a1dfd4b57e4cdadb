package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"shoal/api/openai"
)

// TestChatCommands: lines that start with "/" are the chat's own commands
// and never reach the model ("/help" and "/bye" were sent as messages);
// "//text" sends "/text"; an unknown command says so.
func TestChatCommands(t *testing.T) {
	var mu sync.Mutex
	var sent [][]string // the user messages of each request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct{ Role, Content string }
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var users []string
		for _, m := range req.Messages {
			if m.Role == "user" {
				users = append(users, m.Content)
			}
		}
		mu.Lock()
		sent = append(sent, users)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	c := &openai.Client{BaseURL: srv.URL, HTTP: srv.Client()}
	in := "hello\n/help\n/?\n/frobnicate now\n//etc/hosts is a file\n/reset\nagain\n/bye\nnever sent\n"
	var out, errw bytes.Buffer
	if err := chatLoop(context.Background(), c, openai.ChatParams{Model: "m"}, "", false, strings.NewReader(in), &out, &errw); err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"hello"}, {"hello", "/etc/hosts is a file"}, {"again"}}
	if fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Errorf("the model got %q, want %q", sent, want)
	}
	for _, s := range []string{"/bye", "unknown command /frobnicate", "(conversation cleared)"} {
		if !strings.Contains(errw.String(), s) {
			t.Errorf("stderr lacks %q:\n%s", s, errw.String())
		}
	}
	if n := strings.Count(errw.String(), "commands (never sent"); n != 2 {
		t.Errorf("/help and /? printed the help %d times, want 2", n)
	}
}
