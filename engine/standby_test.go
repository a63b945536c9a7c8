package engine

import "testing"

// A standby applies its active's grants with Install and their ends with
// Drop; its own wheel ends a lease the active's expiry record has not
// reached yet, and Reset starts a fresh copy.
func TestStandbyInstallDropReset(t *testing.T) {
	var tokens Tokens
	sh := NewShard(Config{}, &tokens, 0)
	var out Output
	now := int64(0)
	if err := sh.Install(now, []byte("a"), 7, now+2*sec, nil, Mode{}, 0); err != nil {
		t.Fatal(err)
	}
	if err := sh.Install(now, []byte("b"), 9, now+10*sec, nil, Mode{}, 0); err != nil {
		t.Fatal(err)
	}
	if tokens.Last() != 9 {
		t.Fatalf("tokens after installing 9: last %d", tokens.Last())
	}
	// An extend is an install of the same token with a later deadline.
	if err := sh.Install(now, []byte("a"), 7, now+5*sec, nil, Mode{}, 0); err != nil {
		t.Fatal(err)
	}
	if tok, dl, ok := sh.Holder([]byte("a")); !ok || tok != 7 || dl != 5*sec {
		t.Fatalf("a: %d %d %v", tok, dl, ok)
	}
	if sh.Drop(now, []byte("b"), 8, true, &out) {
		t.Fatal("dropped b with a token it does not hold")
	}
	if !sh.Drop(now, []byte("b"), 9, true, &out) {
		t.Fatal("b not dropped")
	}
	if _, _, ok := sh.Holder([]byte("b")); ok {
		t.Fatal("b still held")
	}
	sh.Advance(5*sec+2*tick, &out)
	if _, _, ok := sh.Holder([]byte("a")); ok {
		t.Fatal("a outlived its lease")
	}
	if len(out.Answers) != 0 {
		t.Fatalf("a standby's shard answered %d times", len(out.Answers))
	}

	// After a Reset, the shard is empty and its wheel still works.
	if err := sh.Install(now, []byte("c"), 11, 6*sec, nil, Mode{}, 0); err != nil {
		t.Fatal(err)
	}
	sh.Reset(5 * sec)
	if k, q := sh.Stats(); k != 0 || q != 0 {
		t.Fatalf("after Reset: %d keys, %d queued", k, q)
	}
	out.WantRecords = true
	sh.Acquire(5*sec, 1, []byte("d"), sec, 0, &out)
	out.Reset()
	sh.Advance(6*sec+2*tick, &out)
	if len(out.Records) != 1 || out.Records[0].Kind != RecordExpire {
		t.Fatalf("records after a lease ended past a Reset: %+v", out.Records)
	}
}
