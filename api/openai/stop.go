package openai

import "strings"

// stopFilter holds generated tokens back while their text might begin a
// stop string, and emits the rest.
type stopFilter struct {
	stops []string
	pend  []genToken
	emit  func(text string, toks []genToken) error
}

func (f *stopFilter) pendText() string {
	var b strings.Builder
	for _, t := range f.pend {
		b.WriteString(t.text)
	}
	return b.String()
}

// settle emits what is safe (everything when final); it reports whether a
// stop string ended the generation.
func (f *stopFilter) settle(final bool) (bool, error) {
	text := f.pendText()
	if idx := earliestStop(text, f.stops); idx >= 0 {
		var out []genToken
		off := 0
		for _, t := range f.pend {
			if off >= idx {
				break
			}
			if off+len(t.text) > idx {
				t.text = t.text[:idx-off]
			}
			off += len(t.text)
			out = append(out, t)
		}
		f.pend = nil
		return true, f.emit(text[:idx], out)
	}
	if final {
		if len(f.pend) == 0 {
			return false, nil
		}
		out := f.pend
		f.pend = nil
		return false, f.emit(text, out)
	}
	safe := len(text) - heldBack(text, f.stops)
	n, end, off := 0, 0, 0
	for i, t := range f.pend {
		off += len(t.text)
		if off > safe {
			break
		}
		if t.text != "" {
			n, end = i+1, off
		}
	}
	if n == 0 {
		return false, nil
	}
	out := f.pend[:n:n]
	f.pend = append([]genToken(nil), f.pend[n:]...)
	return false, f.emit(text[:end], out)
}

// earliestStop returns where the first stop string in text begins, or -1.
func earliestStop(text string, stops []string) int {
	best := -1
	for _, s := range stops {
		if i := strings.Index(text, s); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	return best
}

// heldBack is the length of the longest suffix of text that is a proper
// prefix of a stop string: text that must wait for the next token.
func heldBack(text string, stops []string) int {
	hold := 0
	for _, s := range stops {
		for k := min(len(s)-1, len(text)); k > hold; k-- {
			if strings.HasSuffix(text, s[:k]) {
				hold = k
				break
			}
		}
	}
	return hold
}
