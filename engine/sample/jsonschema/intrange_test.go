package jsonschema

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// rangeRegexp translates the GBNF produced by intRange (literals of
// digits and "-", digit classes, {n}, groups, |) into a Go regexp.
func rangeRegexp(t *testing.T, lo, hi int64) *regexp.Regexp {
	t.Helper()
	expr := intRange(lo, hi)
	re := strings.NewReplacer(`"`, "", " ", "").Replace(expr)
	return regexp.MustCompile("^(?:" + re + ")$")
}

func TestIntRangeExhaustive(t *testing.T) {
	ranges := [][2]int64{
		{-123, 4567}, {0, 0}, {0, 9}, {1, 9}, {5, 5}, {-5, -5}, {-9, 9}, {-10, 10},
		{7, 93}, {10, 99}, {100, 999}, {101, 998}, {-999, -100}, {-1000, -1}, {-4567, 123},
		{19, 2001}, {-3, 0}, {0, 100}, {99, 100}, {1, 1000}, {-1, 0}, {350, 351}, {1234, 5678},
	}
	for _, r := range ranges {
		lo, hi := r[0], r[1]
		re := rangeRegexp(t, lo, hi)
		for n := min(lo*2, lo-100) - 10; n <= max(hi*2, hi+100)+10; n++ {
			s := strconv.FormatInt(n, 10)
			if got, want := re.MatchString(s), n >= lo && n <= hi; got != want {
				t.Fatalf("[%d,%d] %s: match %v, want %v (expr %s)", lo, hi, s, got, want, intRange(lo, hi))
			}
		}
		// non-canonical forms never match
		for _, s := range []string{"-0", "00", "01", "+1", "", "-", "0-"} {
			if re.MatchString(s) {
				t.Errorf("[%d,%d] matches %q", lo, hi, s)
			}
		}
	}
}

func TestIntRangeLarge(t *testing.T) {
	cases := [][2]int64{
		{-9999999999999999, 9999999999999999},
		{-intLimit, intLimit},
		{123456789012, 987654321098765},
		{-987654321098765, -123456789012},
	}
	for _, r := range cases {
		lo, hi := r[0], r[1]
		re := rangeRegexp(t, lo, hi)
		probe := []int64{lo, hi, lo - 1, hi + 1, lo + 1, hi - 1, 0, -1, 1, (lo + hi) / 2, lo/10 - 7, hi/10 + 3, lo * 10, hi * 10}
		for p := int64(1); p < intLimit; p *= 10 {
			probe = append(probe, p, p-1, -p, -p+1, p+1)
		}
		for _, n := range probe {
			if r[1] > 0 && n > 0 && n/10 > hi || n < 0 && lo < 0 && n/10 < lo {
				continue // overflowed probe
			}
			s := strconv.FormatInt(n, 10)
			if got, want := re.MatchString(s), n >= lo && n <= hi; got != want {
				t.Fatalf("[%d,%d] %s: match %v, want %v", lo, hi, s, got, want)
			}
		}
	}
}

func TestIntRangeRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	span := func() int64 {
		switch rng.IntN(3) {
		case 0:
			return rng.Int64N(200) - 100
		case 1:
			return rng.Int64N(200000) - 100000
		}
		return rng.Int64N(2e12) - 1e12
	}
	for range 300 {
		lo, hi := span(), span()
		if lo > hi {
			lo, hi = hi, lo
		}
		re := rangeRegexp(t, lo, hi)
		for range 300 {
			var n int64
			switch rng.IntN(3) {
			case 0:
				n = lo + rng.Int64N(5) - 2
			case 1:
				n = hi + rng.Int64N(5) - 2
			default:
				n = span()
			}
			s := strconv.FormatInt(n, 10)
			if got, want := re.MatchString(s), n >= lo && n <= hi; got != want {
				t.Fatalf("[%d,%d] %s: match %v, want %v", lo, hi, s, got, want)
			}
		}
	}
}
