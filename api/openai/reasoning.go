package openai

import "strings"

// Reasoning models write what they think before they answer; clients
// that show both (Open WebUI, the DeepSeek API's users, llama-server's
// own UI) read it from reasoning_content beside content, as llama-server
// and DeepSeek's API give it. reasoning_format "none" keeps the raw text.

// reasoningFormat is how a model's answer marks its reasoning.
type reasoningFormat int

const (
	reasonNone reasoningFormat = iota
	// reasonThink: <think>...</think> before the answer (DeepSeek-R1,
	// Qwen3, GLM-4.5); a template may open the tag in the prompt.
	reasonThink
	// reasonHarmony: gpt-oss's harmony messages, the analysis channel
	// the reasoning, the final (and commentary) channel the answer.
	reasonHarmony
)

const (
	thinkOpen, thinkClose = "<think>", "</think>"
	harmonyMessage        = "<|message|>"
	harmonyChannel        = "<|channel|>"
	harmonyStart          = "<|start|>"
)

// detectReasoning reads the reasoning format from a chat template.
func detectReasoning(src string) reasoningFormat {
	switch {
	case strings.Contains(src, harmonyChannel):
		return reasonHarmony
	case strings.Contains(src, thinkClose):
		return reasonThink
	}
	return reasonNone
}

// reasoner splits an answer, as it streams, into reasoning and content.
type reasoner struct {
	format reasoningFormat
	mode   int
	held   string // text that may be the start of a marker
}

// The reasoner's modes.
const (
	// <think>: before it, the whitespace that opens it, in it, the
	// whitespace after it, the answer.
	thinkBefore = iota
	thinkFirst
	thinkIn
	thinkAfter
	thinkOut
)

const (
	// harmony: a message's header, an analysis body, an answer body.
	harmonyHeader = iota
	harmonyReasoning
	harmonyAnswer
)

// newReasoner starts the split of an answer in format f; open says the
// prompt ended inside <think> (the template opened it).
func newReasoner(f reasoningFormat, open bool) *reasoner {
	r := &reasoner{format: f}
	if f == reasonThink && open {
		r.mode = thinkFirst
	}
	return r
}

// feed takes the next text of the answer and returns what of it is
// known to be reasoning and content now; the start of a possible marker
// is held back.
func (r *reasoner) feed(text string) (reasoning, content string) {
	return r.split(text, false)
}

// flush returns what feed held back, at the end of the answer.
func (r *reasoner) flush() (reasoning, content string) {
	return r.split("", true)
}

// splitAll splits a whole answer.
func splitAll(f reasoningFormat, open bool, text string) (reasoning, content string) {
	r := newReasoner(f, open)
	a, b := r.feed(text)
	c, d := r.flush()
	return a + c, b + d
}

func (r *reasoner) split(text string, final bool) (string, string) {
	var rs, cs strings.Builder
	buf := r.held + text
	r.held = ""
	if r.format == reasonHarmony {
		buf = r.harmony(buf, final, &rs, &cs)
	} else {
		buf = r.think(buf, final, &rs, &cs)
	}
	r.held = buf
	return rs.String(), cs.String()
}

// think splits <think>...</think> off buf and returns what it holds back.
func (r *reasoner) think(buf string, final bool, rs, cs *strings.Builder) string {
	for {
		switch r.mode {
		case thinkBefore:
			t := strings.TrimLeft(buf, " \t\r\n")
			if strings.HasPrefix(t, thinkOpen) {
				buf, r.mode = t[len(thinkOpen):], thinkFirst
				continue
			}
			if !final && strings.HasPrefix(thinkOpen, t) {
				return buf // whitespace, or the tag's start: wait
			}
			r.mode = thinkOut
		case thinkFirst, thinkAfter:
			// The whitespace that opens the reasoning or follows it.
			buf = strings.TrimLeft(buf, " \t\r\n")
			if buf == "" {
				return ""
			}
			r.mode++ // thinkIn, thinkOut
		case thinkIn:
			if i := strings.Index(buf, thinkClose); i >= 0 {
				rs.WriteString(buf[:i])
				buf, r.mode = buf[i+len(thinkClose):], thinkAfter
				continue
			}
			if final {
				rs.WriteString(buf) // the answer ended while thinking
				return ""
			}
			keep := heldPrefix(buf, thinkClose)
			rs.WriteString(buf[:len(buf)-keep])
			return buf[len(buf)-keep:]
		case thinkOut:
			cs.WriteString(buf)
			return ""
		}
	}
}

// harmonyBodyEnds end a harmony message's body: the next message's start
// (<|end|> is a control token, so it is not in the text), or an end
// marker where the text has it.
var harmonyBodyEnds = []string{harmonyStart, harmonyChannel, "<|end|>", "<|return|>", "<|call|>"}

// harmony splits harmony messages and returns what it holds back. The
// prompt ends with <|start|>assistant, so the answer starts in a header.
func (r *reasoner) harmony(buf string, final bool, rs, cs *strings.Builder) string {
	for {
		switch r.mode {
		case harmonyHeader:
			i := strings.Index(buf, harmonyMessage)
			if i < 0 {
				if final {
					cs.WriteString(buf) // not a harmony message: shown as it is
					return ""
				}
				return buf
			}
			r.mode = harmonyAnswer
			if strings.Contains(buf[:i], harmonyChannel+"analysis") {
				r.mode = harmonyReasoning
			}
			buf = buf[i+len(harmonyMessage):]
		default:
			out := cs
			if r.mode == harmonyReasoning {
				out = rs
			}
			i, m := -1, ""
			for _, x := range harmonyBodyEnds {
				if j := strings.Index(buf, x); j >= 0 && (i < 0 || j < i) {
					i, m = j, x
				}
			}
			if i >= 0 {
				out.WriteString(buf[:i])
				buf, r.mode = buf[i:], harmonyHeader
				if m != harmonyStart && m != harmonyChannel {
					buf = buf[len(m):] // an end marker rendered as text
				}
				continue
			}
			keep := 0
			if !final {
				for _, x := range harmonyBodyEnds {
					keep = max(keep, heldPrefix(buf, x))
				}
			}
			out.WriteString(buf[:len(buf)-keep])
			return buf[len(buf)-keep:]
		}
	}
}

// heldPrefix is the length of the longest end of s that begins marker.
func heldPrefix(s, marker string) int {
	for k := min(len(marker)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, marker[:k]) {
			return k
		}
	}
	return 0
}
