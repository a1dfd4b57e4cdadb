package loadgen

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Header describes the run in one line.
func (r *Result) Header() string {
	bound := fmt.Sprintf("%d requests per level", r.Requests)
	switch {
	case r.Requests > 0 && r.Duration != "":
		bound = fmt.Sprintf("%d requests or %s per level", r.Requests, r.Duration)
	case r.Duration != "":
		bound = r.Duration + " per level"
	case r.Requests == 0:
		bound = "max(8, 4×c) requests per level"
	}
	eos := ""
	if r.IgnoreEOS {
		eos = ", ignore_eos"
	}
	if r.Steady {
		bound += " (steady: cut at the end)"
	}
	if r.PromptTokens > 0 {
		eos += fmt.Sprintf(", random prompts of %d tokens", r.PromptTokens)
	}
	if p := r.Periodic; p != nil {
		bound += fmt.Sprintf("; every %s one more request of max_tokens %d", p.EveryText, p.MaxTokens)
		if p.PromptTokens > 0 {
			bound += fmt.Sprintf(" and a random prompt of %d tokens", p.PromptTokens)
		}
	}
	return fmt.Sprintf("%s  model %s  api %s  max_tokens %d%s  %s", r.Endpoint, r.Model, r.API, r.MaxTokens, eos, bound)
}

// WriteTable prints the levels as an aligned table (latencies in ms).
func WriteTable(w io.Writer, r *Result) error {
	if _, err := fmt.Fprintln(w, r.Header()); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conc\treqs\terrors\tgen tok\twall s\ttok/s\ttok/s/stream\tTTFT p50\tTTFT p99\tITL p50\tITL p99\tTPOT p50\t")
	row := func(conc string, l Level) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%s\t\n",
			conc, l.Requests, l.Errors, l.GeneratedTokens, l.WallSeconds, l.TokensPerSecond, l.PerStreamTokensPerSecond,
			ms(l.TTFT.N, l.TTFT.P50), ms(l.TTFT.N, l.TTFT.P99), ms(l.InterToken.N, l.InterToken.P50), ms(l.InterToken.N, l.InterToken.P99),
			ms(l.TPOT.N, l.TPOT.P50))
	}
	for _, l := range r.Levels {
		row(strconv.Itoa(l.Concurrency), l)
		if l.Periodic != nil && r.Periodic != nil {
			row("every "+r.Periodic.EveryText, *l.Periodic)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range r.Levels {
		if l.Cut > 0 {
			if _, err := fmt.Fprintf(w, "c=%d: %d requests cut at the end (their tokens counted)\n", l.Concurrency, l.Cut); err != nil {
				return err
			}
		}
		if p := l.Periodic; p != nil && p.Errors > 0 {
			if _, err := fmt.Fprintf(w, "c=%d periodic errors: %d; first: %s\n", l.Concurrency, p.Errors, p.FirstError); err != nil {
				return err
			}
		}
		if l.Errors == 0 {
			continue
		}
		var kinds []string
		for _, k := range slices.Sorted(maps.Keys(l.ErrorKinds)) {
			kinds = append(kinds, fmt.Sprintf("%s ×%d", k, l.ErrorKinds[k]))
		}
		if _, err := fmt.Fprintf(w, "c=%d errors: %s; first: %s\n", l.Concurrency, strings.Join(kinds, ", "), l.FirstError); err != nil {
			return err
		}
	}
	return nil
}

func ms(n int, v float64) string {
	if n == 0 {
		return "-"
	}
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
