package openai

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// templateSources is testdata/templates/sources.json: the real chat
// templates whose renders llama.cpp measured (see its README), and the
// inputs it measured them with.
type templateSources struct {
	Date          string   `json:"date"`
	BOS           string   `json:"bos"`
	EOS           string   `json:"eos"`
	Conversations []string `json:"conversations"`
	Templates     []struct {
		File   string `json:"file"`
		SHA256 string `json:"sha256"`
		Module string `json:"module"` // a Go module whose index holds it
		Path   string `json:"path"`
		Name   string `json:"name"` // its name in the module's index
	} `json:"templates"`
}

// TestRealChatTemplates renders the conversations of
// testdata/templates/conversations through real models' chat templates,
// as a chat request does, and compares with what llama.cpp 0.7.0 rendered
// (testdata/templates/llama). The templates are not in the repository:
// they are read from $SHOAL_TEMPLATE_DIR (Gemma 3's also from the Go
// module cache), and a template that is not there is skipped.
func TestRealChatTemplates(t *testing.T) {
	const dir = "testdata/templates"
	var src templateSources
	b, err := os.ReadFile(filepath.Join(dir, "sources.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &src); err != nil {
		t.Fatal(err)
	}
	now, err := time.Parse(time.DateOnly, src.Date)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range src.Templates {
		name := strings.TrimSuffix(ts.File, ".jinja")
		t.Run(name, func(t *testing.T) {
			text, err := templateSource(ts.File, ts.Module, ts.Path, ts.Name)
			if err != nil {
				t.Skipf("template source not found (%v); set SHOAL_TEMPLATE_DIR to a folder holding %s (see %s/README.md)", err, ts.File, dir)
			}
			if sum := sha256.Sum256([]byte(text)); hex.EncodeToString(sum[:]) != ts.SHA256 {
				t.Fatalf("%s has sha256 %x, not the measured template's %s", ts.File, sum, ts.SHA256)
			}
			tpl, err := ParseChatTemplate(text)
			if err != nil {
				t.Fatal(err)
			}
			for _, conv := range src.Conversations {
				t.Run(conv, func(t *testing.T) {
					in := conversationInput(t, filepath.Join(dir, "conversations", conv+".json"))
					in.BOS, in.EOS, in.Now = src.BOS, src.EOS, now
					got, err := tpl.Render(in)
					base := filepath.Join(dir, "llama", name+"."+conv)
					if want, rerr := os.ReadFile(base + ".error"); rerr == nil {
						var te *TemplateError
						if !errors.As(err, &te) || !strings.Contains(string(want), te.Message) {
							t.Fatalf("llama.cpp refused it (%s), shoal: %q, %v", strings.TrimSpace(string(want)), got, err)
						}
						return
					}
					want, rerr := os.ReadFile(base + ".txt")
					if rerr != nil {
						t.Fatal(rerr)
					}
					if err != nil {
						t.Fatal(err)
					}
					// llama.cpp drops the template's leading BOS when the
					// vocabulary adds one (its tokenizer does); shoal keeps
					// it and does not add a second (chatPrompt).
					got = strings.TrimPrefix(got, src.BOS)
					if got != string(want) {
						t.Fatalf("differs from llama.cpp's render %s", firstDifference(got, string(want)))
					}
				})
			}
		})
	}
}

// templateSource reads a measured template: from $SHOAL_TEMPLATE_DIR, or
// the named entry of a Go module's template index in the module cache.
func templateSource(file, module, path, name string) (string, error) {
	if d := os.Getenv("SHOAL_TEMPLATE_DIR"); d != "" {
		if b, err := os.ReadFile(filepath.Join(d, file)); err == nil {
			return string(b), nil
		}
	}
	if module == "" {
		return "", errors.New("SHOAL_TEMPLATE_DIR does not hold it")
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			gopath = filepath.Join(home, "go")
		}
		cache = filepath.Join(filepath.SplitList(gopath)[0], "pkg", "mod")
	}
	b, err := os.ReadFile(filepath.Join(cache, module, path))
	if err != nil {
		return "", err
	}
	var index []struct{ Name, Template string }
	if err := json.Unmarshal(b, &index); err != nil {
		return "", err
	}
	for _, e := range index {
		if e.Name == name {
			return e.Template, nil
		}
	}
	return "", fmt.Errorf("%s has no template %q", path, name)
}

// conversationInput reads a chat request's messages and tools into the
// template input the way the handler does when the tools go to the
// template (a format other than the generic one).
func conversationInput(t *testing.T, file string) TemplateInput {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var req ChatRequest
	if err := json.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	msgs, e := templateMessages(req.Messages)
	if e != nil {
		t.Fatal(e.msg)
	}
	in := TemplateInput{Messages: msgs, AddGenerationPrompt: true}
	p, e := readTools(&req)
	if e != nil {
		t.Fatal(e.msg)
	}
	if p != nil {
		in.Tools = p.raw
	}
	return in
}

// firstDifference shows where got and want part.
func firstDifference(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(i-60, 0)
	return fmt.Sprintf("at byte %d:\n got  %q\n want %q", i, got[from:min(i+80, len(got))], want[from:min(i+80, len(want))])
}
