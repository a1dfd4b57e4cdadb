package openai

import "testing"

func TestExp(t *testing.T) {
	for _, src := range []string{
		"{%- if true %}\n  x\n{%- endif %}\n{% if true %}\ny\n{% endif %}\nz",
		`{{ messages | tojson }} {{ {'b': [1, 2.5, none, true], 'a': "é\n"} | tojson }} {{ messages[0] | tojson(indent=2) }}`,
		`{{ strftime_now("%d %b %Y") }}`,
		`{{ raise_exception('bad roles') }}after`,
		ChatMLTemplate,
	} {
		tpl, err := ParseChatTemplate(src)
		if err != nil {
			t.Log("parse:", err)
			continue
		}
		out, err := tpl.Render(TemplateInput{Messages: []TemplateMessage{{Role: "user", Content: "hi"}}, AddGenerationPrompt: true})
		t.Logf("%q err=%v", out, err)
	}
}
