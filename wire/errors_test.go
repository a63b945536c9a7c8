package wire

import (
	"errors"
	"fmt"
	"testing"
)

func TestReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{ErrLineTooLong, "line too long"},
		{ErrEmpty, "empty request"},
		{ErrUnknownOp, "unknown op"},
		{ErrBadKey, "bad key"},
		{ErrMissingField, "missing field"},
		{ErrTooManyFields, "too many fields"},
		{ErrBadLease, "bad lease"},
		{ErrLeaseTooLong, "lease too long"},
		{ErrBadWait, "bad wait"},
		{ErrWaitTooLong, "wait too long"},
		{ErrBadToken, "bad token"},
		{ErrBadName, "bad name"},
		{ErrBadSecret, "bad secret"},
		{ErrBadAnswer, "bad answer"},
		{errors.New("engine: too many waiters"), "too many waiters"},
		{errors.New("engine: busy: try later"), "busy: try later"},
		{errors.New("no prefix"), "no prefix"},
		{errors.New("engine:no space"), "engine:no space"},
		{fmt.Errorf("server: %w", ErrBadKey), "wire: bad key"},
		{nil, ""},
	} {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestReasonAllocs(t *testing.T) {
	var s string
	if n := testing.AllocsPerRun(100, func() { s = Reason(ErrTooManyFields) }); n != 0 {
		t.Errorf("Reason: %v allocs (%q)", n, s)
	}
}
