package wire

import (
	"math"
	"strconv"
	"testing"
)

func TestParseSeconds(t *testing.T) {
	for _, tc := range []struct {
		in string
		ms int64
		ok bool
	}{
		{"0", 0, true}, {"30", 30000, true}, {"0.5", 500, true}, {"2.125", 2125, true},
		{"1.05", 1050, true}, {"1.001", 1001, true}, {"1.10", 1100, true}, {"007", 7000, true},
		{"0.000", 0, true}, {"86400", 86400000, true},
		{"000000000000000000000000000000000001.5", 1500, true},
		{"9223372036854775.807", math.MaxInt64, true},
		{"9223372036854775", 9223372036854775000, true},
		{"", 0, false}, {".5", 0, false}, {"5.", 0, false}, {"+1", 0, false}, {"-1", 0, false},
		{"1e3", 0, false}, {"0x10", 0, false}, {"1.2345", 0, false}, {"1.2.3", 0, false},
		{" 1", 0, false}, {"1 ", 0, false}, {".", 0, false}, {"1.a", 0, false}, {"a", 0, false},
		{"9223372036854775.808", 0, false}, {"9223372036854776", 0, false},
		{"18446744073709551616", 0, false}, {"99999999999999999999999999999", 0, false},
		{"1/", 0, false}, {"1:", 0, false}, {"1.:", 0, false},
	} {
		ms, ok := ParseSeconds([]byte(tc.in))
		if ms != tc.ms || ok != tc.ok {
			t.Errorf("ParseSeconds(%q) = %d %v, want %d %v", tc.in, ms, ok, tc.ms, tc.ok)
		}
	}
}

func TestAppendSeconds(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want string
	}{
		{0, "0"}, {1, "0.001"}, {10, "0.01"}, {100, "0.1"}, {500, "0.5"}, {1050, "1.05"},
		{1001, "1.001"}, {2125, "2.125"}, {30000, "30"}, {86400000, "86400"},
		{math.MaxInt64, "9223372036854775.807"}, {-1500, "-1.5"}, {math.MinInt64, "-9223372036854775.808"},
	} {
		if got := string(AppendSeconds(nil, tc.ms)); got != tc.want {
			t.Errorf("AppendSeconds(%d) = %q, want %q", tc.ms, got, tc.want)
		}
	}
}

func TestSecondsRoundTrip(t *testing.T) {
	var buf []byte
	check := func(ms int64) {
		buf = AppendSeconds(buf[:0], ms)
		if got, ok := ParseSeconds(buf); !ok || got != ms {
			t.Fatalf("%d → %q → %d %v", ms, buf, got, ok)
		}
	}
	for ms := int64(0); ms <= 20000; ms++ {
		check(ms)
	}
	for ms := int64(math.MaxInt64); ms > math.MaxInt64-2000; ms-- {
		check(ms)
	}
	for ms := int64(1); ms > 0 && ms < math.MaxInt64/7; ms = ms*7 + 3 {
		check(ms)
	}
}

func TestParseToken(t *testing.T) {
	for _, tc := range []struct {
		in string
		t  uint64
		ok bool
	}{
		{"1", 1, true}, {"1001", 1001, true}, {"18446744073709551615", math.MaxUint64, true},
		{"00018446744073709551615", math.MaxUint64, true},
		{"0", 0, false}, {"", 0, false}, {"18446744073709551616", 0, false},
		{"18446744073709551620", 0, false}, {"99999999999999999999", 0, false},
		{"-1", 0, false}, {"+1", 0, false}, {"1.0", 0, false}, {"0x1", 0, false},
	} {
		tok, ok := parseToken([]byte(tc.in))
		if ok != tc.ok || ok && tok != tc.t {
			t.Errorf("parseToken(%q) = %d %v, want %d %v", tc.in, tok, ok, tc.t, tc.ok)
		}
	}
}

func TestAppendUint(t *testing.T) {
	check := func(u uint64) {
		if got, want := string(appendUint([]byte("x"), u)), "x"+strconv.FormatUint(u, 10); got != want {
			t.Fatalf("appendUint(%d) = %q, want %q", u, got, want)
		}
	}
	for u := uint64(0); u < 100000; u++ {
		check(u)
	}
	for u := uint64(1); u < math.MaxUint64/3; u = u*3 + 1 {
		check(u)
		check(u - 1)
	}
	for _, u := range []uint64{math.MaxUint64, math.MaxUint64 - 1, 1e19, 1e19 - 1, 1<<63 - 1, 1 << 63} {
		check(u)
	}
}
