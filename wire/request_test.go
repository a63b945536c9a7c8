package wire

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// reqWant is the expected outcome of parsing one line: a valid request, or
// the E line that the refusal produces (which shows the echo fields).
type reqWant struct {
	op     Op
	key    string
	lease  int64
	wait   int64
	token  uint64
	name   string // U
	secret string // U
	owner  string // A
	slots  uint32 // A
	shared bool   // A
	limit  uint64 // L
	prefix string // L
	again  bool   // A: seen= given
	seen   uint64 // A
	sess   uint64 // S
	e      string // for a refusal: the E line AppendRefusal writes
}

func TestParseRequestValid(t *testing.T) {
	long := strings.Repeat("k", MaxKey)
	for _, tc := range []struct {
		in   string
		want reqWant
	}{
		{"A orders/42 30 5\n", reqWant{op: OpAcquire, key: "orders/42", lease: 30000, wait: 5000}},
		{"A orders/42 30 0.5\n", reqWant{op: OpAcquire, key: "orders/42", lease: 30000, wait: 500}},
		{"A k 2.125 0\n", reqWant{op: OpAcquire, key: "k", lease: 2125, wait: 0}},
		{"A k 0.001 86400\n", reqWant{op: OpAcquire, key: "k", lease: 1, wait: 86400000}},
		{"A k 86400.000 86400.0\n", reqWant{op: OpAcquire, key: "k", lease: 86400000, wait: 86400000}},
		{"A k 007 00.10\n", reqWant{op: OpAcquire, key: "k", lease: 7000, wait: 100}},
		{"A k 1.05 0.25\r\n", reqWant{op: OpAcquire, key: "k", lease: 1050, wait: 250}},
		{"A ключ/1 30 5\n", reqWant{op: OpAcquire, key: "ключ/1", lease: 30000, wait: 5000}},
		{"A \x80\xff 1 1\n", reqWant{op: OpAcquire, key: "\x80\xff", lease: 1000, wait: 1000}},
		{"A - 1 1\n", reqWant{op: OpAcquire, key: "-", lease: 1000, wait: 1000}},
		{"A " + long + " 1 1\n", reqWant{op: OpAcquire, key: long, lease: 1000, wait: 1000}},
		{"A !~ 1 1\n", reqWant{op: OpAcquire, key: "!~", lease: 1000, wait: 1000}},
		{"R orders/42 1001\n", reqWant{op: OpRelease, key: "orders/42", token: 1001}},
		{"R k 1\r\n", reqWant{op: OpRelease, key: "k", token: 1}},
		{"R k 18446744073709551615\n", reqWant{op: OpRelease, key: "k", token: 1<<64 - 1}},
		{"R k 0001\n", reqWant{op: OpRelease, key: "k", token: 1}},
		{"X k 7 1.5\n", reqWant{op: OpExtend, key: "k", token: 7, lease: 1500}},
		{"X k 7 86400\r\n", reqWant{op: OpExtend, key: "k", token: 7, lease: 86400000}},
		{"C k\n", reqWant{op: OpCancel, key: "k"}},
		{"C k\r\n", reqWant{op: OpCancel, key: "k"}},
		{"I\n", reqWant{op: OpInfo}},
		{"I\r\n", reqWant{op: OpInfo}},
		{"U app s3cret/Key+0=\n", reqWant{op: OpAuth, name: "app", secret: "s3cret/Key+0="}},
		{"U a b\r\n", reqWant{op: OpAuth, name: "a", secret: "b"}},
		{"U " + long + " " + long + "\n", reqWant{op: OpAuth, name: long, secret: long}},
		{"U é \x80\xff\n", reqWant{op: OpAuth, name: "é", secret: "\x80\xff"}},
		// Try-lock: wait "-".
		{"A k 30 -\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: NoWait}},
		{"A k 30 -\r\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: NoWait}},
		// Owners.
		{"A k 30 5 owner=web-3:4121\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: 5000, owner: "web-3:4121"}},
		{"A k 30 - owner=x\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: NoWait, owner: "x"}},
		{"A k 1 0 owner=" + strings.Repeat("o", MaxOwner) + "\r\n", reqWant{op: OpAcquire, key: "k", lease: 1000, owner: strings.Repeat("o", MaxOwner)}},
		{"A k 1 0 owner=owner=!~\n", reqWant{op: OpAcquire, key: "k", lease: 1000, owner: "owner=!~"}},
		// Semaphores and shared grants.
		{"A k 30 0 limit=3\n", reqWant{op: OpAcquire, key: "k", lease: 30000, slots: 3}},
		{"A k 30 - limit=1024 owner=w\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: NoWait, slots: 1024, owner: "w"}},
		{"A k 30 5 owner=w limit=007\r\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: 5000, slots: 7, owner: "w"}},
		{"A k 30 0 mode=shared\n", reqWant{op: OpAcquire, key: "k", lease: 30000, shared: true}},
		{"A k 30 0 mode=shared owner=r\n", reqWant{op: OpAcquire, key: "k", lease: 30000, shared: true, owner: "r"}},
		{"A k 30 0 mode=exclusive\n", reqWant{op: OpAcquire, key: "k", lease: 30000}},
		// Sessions.
		{"S 1\n", reqWant{op: OpSession, sess: 1}},
		{"S 18446744073709551615\r\n", reqWant{op: OpSession, sess: 1<<64 - 1}},
		{"S 0042\n", reqWant{op: OpSession, sess: 42}},
		{"A k 30 5 seen=1041\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: 5000, again: true, seen: 1041}},
		{"A k 30 5 seen=0\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: 5000, again: true}},
		{"A k 30 - seen=7 owner=w mode=shared\n", reqWant{op: OpAcquire, key: "k", lease: 30000, wait: NoWait, again: true, seen: 7, owner: "w", shared: true}},
		{"A k 30 0 limit=2 seen=18446744073709551615\n", reqWant{op: OpAcquire, key: "k", lease: 30000, slots: 2, again: true, seen: 1<<64 - 1}},
		// Inspect.
		{"Q orders/42\n", reqWant{op: OpInspect, key: "orders/42"}},
		{"Q k\r\n", reqWant{op: OpInspect, key: "k"}},
		{"Q " + long + "\n", reqWant{op: OpInspect, key: long}},
	} {
		checkRequest(t, tc.in, nil, tc.want)
	}
}

func TestParseRequestRefusals(t *testing.T) {
	long := strings.Repeat("k", MaxKey+1)
	for _, tc := range []struct{ in, e string }{
		// Empty.
		{"\n", "E - - empty request"},
		{"\r\n", "E - - empty request"},
		// Op.
		{"a k\n", "E a k unknown op"},
		{"i\n", "E i - unknown op"},
		{"AA k 1 1\n", "E AA k unknown op"},
		{"Z\n", "E Z - unknown op"},
		{"Z bad\x01key\n", "E Z - unknown op"},
		{"Z " + long + "\n", "E Z - unknown op"},
		{" A k 1 1\n", "E - A unknown op"},
		{"  k\n", "E - - unknown op"},
		{" \n", "E - - unknown op"},
		{"\tA k\n", "E - k unknown op"},
		{"A\tk 1 1\n", "E - 1 unknown op"},
		{"\rA k 1 1\n", "E - k unknown op"},
		{"A\r\r\n", "E - - unknown op"},
		{"\x00\n", "E - - unknown op"},
		{"é k\n", "E - k unknown op"},
		{"ABCDEFGHIJKLMNOP k\n", "E ABCDEFGHIJKLMNOP k unknown op"},
		{"ABCDEFGHIJKLMNOPQ k\n", "E - k unknown op"},
		{"GET / HTTP/1.1\r\n", "E GET / unknown op"},
		// Key, before the field count.
		{"A \n", "E A - bad key"},
		{"C \n", "E C - bad key"},
		{"A  k 1 1\n", "E A - bad key"},
		{"A k\x01 1 1\n", "E A - bad key"},
		{"A k\x7f 1 1\n", "E A - bad key"},
		{"A k\r 1 1\n", "E A - bad key"},
		{"C k\r\r\n", "E C - bad key"},
		{"C k\t\n", "E C - bad key"},
		{"A " + long + " 1 1\n", "E A - bad key"},
		{"A bad\x01 x\n", "E A - bad key"},
		{"R " + long + "\n", "E R - bad key"},
		// Field count, before the fields.
		{"A\n", "E A - missing field"},
		{"R\n", "E R - missing field"},
		{"X\r\n", "E X - missing field"},
		{"C\n", "E C - missing field"},
		{"A k\n", "E A k missing field"},
		{"A k 30\n", "E A k missing field"},
		{"A k bad\n", "E A k missing field"},
		{"R k\n", "E R k missing field"},
		{"X k\n", "E X k missing field"},
		{"X k 1\n", "E X k missing field"},
		{"A orders/42 30 0 lots\n", "E A orders/42 too many fields"},
		{"A k 30 5 \n", "E A k too many fields"},
		{"A k bad 5 extra\n", "E A k too many fields"},
		{"R k 1 2\n", "E R k too many fields"},
		{"R k 0 x\n", "E R k too many fields"},
		{"X k 1 30 5\n", "E X k too many fields"},
		{"C k x\n", "E C k too many fields"},
		{"C k \n", "E C k too many fields"},
		{"I x\n", "E I x too many fields"},
		{"I \n", "E I - too many fields"},
		{"I x y\n", "E I x too many fields"},
		{"I \x01\n", "E I - too many fields"},
		// Lease.
		{"A k 0 5\n", "E A k bad lease"},
		{"A k 0.000 5\n", "E A k bad lease"},
		{"A k  5\n", "E A k bad lease"},
		{"A k .5 5\n", "E A k bad lease"},
		{"A k 5. 5\n", "E A k bad lease"},
		{"A k +1 5\n", "E A k bad lease"},
		{"A k -1 5\n", "E A k bad lease"},
		{"A k 1e3 5\n", "E A k bad lease"},
		{"A k 0x10 5\n", "E A k bad lease"},
		{"A k 1.2345 5\n", "E A k bad lease"},
		{"A k 1.5.5 5\n", "E A k bad lease"},
		{"A k 1,5 5\n", "E A k bad lease"},
		{"A k 3\x000 5\n", "E A k bad lease"},
		{"A k 30\r 5\n", "E A k bad lease"},
		{"A k 9223372036854776 5\n", "E A k bad lease"},
		{"A k 9223372036854775.808 5\n", "E A k bad lease"},
		{"A k 99999999999999999999999999 5\n", "E A k bad lease"},
		{"A k 9223372036854775.807 5\n", "E A k lease too long"},
		{"A k 86400.001 5\n", "E A k lease too long"},
		{"A k 100000 5\n", "E A k lease too long"},
		{"A k x y\n", "E A k bad lease"},
		{"A k 0 -1\n", "E A k bad lease"},
		{"A k 99999999 -1\n", "E A k lease too long"},
		{"X k 1 0\n", "E X k bad lease"},
		{"X k 1 1.0000\n", "E X k bad lease"},
		{"X k 1 86400.001\n", "E X k lease too long"},
		{"X k 1 \n", "E X k bad lease"},
		// Wait.
		{"A k 1 \n", "E A k bad wait"},
		{"A k 1 x\n", "E A k bad wait"},
		{"A k 1 -1\n", "E A k bad wait"},
		{"A k 1 .5\n", "E A k bad wait"},
		{"A k 1 0.5000\n", "E A k bad wait"},
		{"A k 1 5\t\n", "E A k bad wait"},
		{"A k 1 5\r\r\n", "E A k bad wait"},
		{"A k 1 99999999999999999999999999\n", "E A k bad wait"},
		{"A k 1 86400.001\n", "E A k wait too long"},
		// Token.
		{"R k 0\n", "E R k bad token"},
		{"R k 000\n", "E R k bad token"},
		{"R k \n", "E R k bad token"},
		{"R k -1\n", "E R k bad token"},
		{"R k +1\n", "E R k bad token"},
		{"R k 1a\n", "E R k bad token"},
		{"R k 1.0\n", "E R k bad token"},
		{"R k 18446744073709551616\n", "E R k bad token"},
		{"R k 99999999999999999999\n", "E R k bad token"},
		{"X k 0 5\n", "E X k bad token"},
		{"X k 0 0\n", "E X k bad token"},
		{"X k x 1.0000\n", "E X k bad token"},
		// U: the name and the secret are never echoed.
		{"U\n", "E U - missing field"},
		{"U topsecret\n", "E U - missing field"},
		{"U \n", "E U - bad name"},
		{"U  topsecret\n", "E U - bad name"},
		{"U na\x01me topsecret\n", "E U - bad name"},
		{"U " + long + " topsecret\n", "E U - bad name"},
		{"U name \n", "E U - bad secret"},
		{"U name top\x7fsecret\n", "E U - bad secret"},
		{"U name " + long + "\n", "E U - bad secret"},
		{"U name topsecret \n", "E U - too many fields"},
		{"U name topsecret x\n", "E U - too many fields"},
		{"U name\x01 top secret\n", "E U - bad name"},
		{"UU name topsecret\n", "E UU name unknown op"},
		{"u name topsecret\n", "E u name unknown op"},
		// Try-lock and owners.
		{"A k 30 --\n", "E A k bad wait"},
		{"A k 30 -1\n", "E A k bad wait"},
		{"A k 30 -0.5\n", "E A k bad wait"},
		{"A k 30 - lots\n", "E A k too many fields"},
		{"A k 30 0 owner=a b\n", "E A k too many fields"},
		{"A k 30 0 owner=a \n", "E A k too many fields"},
		{"A k 30 0 Owner=a\n", "E A k too many fields"},
		{"A k 30 0 owner\n", "E A k too many fields"},
		{"A k 30 0 who=a\n", "E A k too many fields"},
		{"A k 30 0 \n", "E A k too many fields"},
		{"A k 30 0 owner=\n", "E A k bad owner"},
		{"A k 30 0 limit=0\n", "E A k bad limit"},
		{"A k 30 0 limit=\n", "E A k bad limit"},
		{"A k 30 0 limit=-1\n", "E A k bad limit"},
		{"A k 30 0 limit=+2\n", "E A k bad limit"},
		{"A k 30 0 limit=2x\n", "E A k bad limit"},
		{"A k 30 0 limit=4294967296\n", "E A k bad limit"},
		{"A k 30 0 limit=1025\n", "E A k limit too high"},
		{"A k 30 0 limit=99999999999999999999\n", "E A k bad limit"},
		{"A k 30 0 mode=\n", "E A k bad mode"},
		{"A k 30 0 mode=read\n", "E A k bad mode"},
		{"A k 30 0 mode=Shared\n", "E A k bad mode"},
		{"A k 30 0 limit=2 mode=shared\n", "E A k bad mode"},
		{"A k 30 0 mode=exclusive limit=2\n", "E A k bad mode"},
		{"A k 30 0 limit=0 mode=read\n", "E A k bad limit"},
		{"A k 30 0 mode=read limit=0\n", "E A k bad mode"},
		{"A k 30 0 owner= limit=0\n", "E A k bad owner"},
		{"A k 30 0 limit=2 limit=2\n", "E A k too many fields"},
		{"A k 30 0 mode=shared mode=shared\n", "E A k too many fields"},
		{"A k 30 0 owner=a owner=a\n", "E A k too many fields"},
		{"A k 30 0 owner=a limit=2 mode=shared x\n", "E A k too many fields"},
		{"A k 30 0 kind=sem\n", "E A k too many fields"},
		{"A k 0 0 limit=0\n", "E A k bad lease"},
		{"A k 30 0 owner=" + strings.Repeat("o", MaxOwner+1) + "\n", "E A k bad owner"},
		{"A k 30 0 owner=é\n", "E A k bad owner"},
		{"A k 30 0 owner=a\x01\n", "E A k bad owner"},
		{"A k 30 0 owner=a\x7f\n", "E A k bad owner"},
		{"A k 0 0 owner=\n", "E A k bad lease"},
		{"A k 30 x owner=\n", "E A k bad wait"},
		// Sessions, and seen.
		{"S\n", "E S - missing field"},
		{"S \n", "E S - bad session"},
		{"S 0\n", "E S 0 bad session"},
		{"S x\n", "E S x bad session"},
		{"S -1\n", "E S -1 bad session"},
		{"S 18446744073709551616\n", "E S 18446744073709551616 bad session"},
		{"S 1 2\n", "E S 1 too many fields"},
		{"SS 1\n", "E SS 1 unknown op"},
		{"A k 30 0 seen=\n", "E A k bad seen"},
		{"A k 30 0 seen=-1\n", "E A k bad seen"},
		{"A k 30 0 seen=1x\n", "E A k bad seen"},
		{"A k 30 0 seen=18446744073709551616\n", "E A k bad seen"},
		{"A k 30 0 seen=1 seen=1\n", "E A k too many fields"},
		{"A k 30 0 seen=x owner=\n", "E A k bad seen"},
		{"A k 30 0 owner=a limit=2 seen=3 x\n", "E A k too many fields"},
		// Inspect.
		{"Q\n", "E Q - missing field"},
		{"Q \n", "E Q - bad key"},
		{"Q k x\n", "E Q k too many fields"},
		{"Q " + long + "\n", "E Q - bad key"},
		{"QQ k\n", "E QQ k unknown op"},
		// Listing.
		{"L\n", "E L - missing field"},
		{"L \n", "E L - bad limit"},
		{"L x\n", "E L x bad limit"},
		{"L -1\n", "E L -1 bad limit"},
		{"L 1.5\n", "E L 1.5 bad limit"},
		{"L 18446744073709551616\n", "E L 18446744073709551616 bad limit"},
		{"L 10 \n", "E L 10 bad prefix"},
		{"L 10 a\x01\n", "E L 10 bad prefix"},
		{"L 10 " + long + "\n", "E L 10 bad prefix"},
		{"L 10 a b\n", "E L 10 too many fields"},
		{"L x a b\n", "E L x too many fields"},
		{"L x a\x01\n", "E L x bad limit"},
	} {
		checkRequest(t, tc.in, nil, reqWant{e: tc.e})
	}
}

func TestParseRequestLimits(t *testing.T) {
	lease := &Limits{MaxLease: 60000}
	wait := &Limits{MaxWait: 1000}
	for _, tc := range []struct {
		in   string
		lim  *Limits
		want reqWant
	}{
		{"A k 60 86400\n", lease, reqWant{op: OpAcquire, key: "k", lease: 60000, wait: 86400000}},
		{"A k 60.001 0\n", lease, reqWant{e: "E A k lease too long"}},
		{"X k 1 60.001\n", lease, reqWant{e: "E X k lease too long"}},
		{"A k 86400 1\n", wait, reqWant{op: OpAcquire, key: "k", lease: 86400000, wait: 1000}},
		{"A k 1 1.001\n", wait, reqWant{e: "E A k wait too long"}},
		{"A k 1 -\n", &Limits{MaxLease: 1000, MaxWait: 1}, reqWant{op: OpAcquire, key: "k", lease: 1000, wait: NoWait}},
		{"A k 86400.001 1\n", wait, reqWant{e: "E A k lease too long"}},
		{"A k 1 0\n", &Limits{MaxLease: 1, MaxWait: 1}, reqWant{e: "E A k lease too long"}},
		{"A k 0.001 0.002\n", &Limits{MaxLease: 1, MaxWait: 1}, reqWant{e: "E A k wait too long"}},
		{"A k 0.001 0\n", &Limits{MaxLease: 1, MaxWait: 1}, reqWant{op: OpAcquire, key: "k", lease: 1}},
		{"A k 100000 100000\n", &Limits{MaxLease: 1e8, MaxWait: 1e8}, reqWant{op: OpAcquire, key: "k", lease: 1e8, wait: 1e8}},
	} {
		checkRequest(t, tc.in, tc.lim, tc.want)
	}
}

// checkRequest parses in, a single line, and compares the outcome with want.
func checkRequest(t *testing.T, in string, lim *Limits, want reqWant) {
	t.Helper()
	buf := []byte(in + "A k 1 1\n") // a following line must not matter
	var req Request
	n, err := ParseRequest(buf, lim, &req)
	if n != len(in) {
		t.Errorf("%q: n = %d, want %d (err %v)", in, n, len(in), err)
		return
	}
	if want.e != "" {
		if err == nil {
			t.Errorf("%q: accepted as %+v, want %q", in, req, want.e)
			return
		}
		if got := string(AppendRefusal(nil, &req, err)); got != want.e+"\n" {
			t.Errorf("%q: refusal %q, want %q", in, got, want.e+"\n")
		}
		checkEcho(t, in, &req)
		return
	}
	if err != nil {
		t.Errorf("%q: err %v (%q)", in, err, AppendRefusal(nil, &req, err))
		return
	}
	if req.Op != want.op || string(req.Key) != want.key || req.Lease != want.lease ||
		req.Wait != want.wait || req.Token != want.token ||
		string(req.Name) != want.name || string(req.Secret) != want.secret ||
		string(req.Owner) != want.owner || req.Slots != want.slots || req.Shared != want.shared || req.Limit != want.limit || string(req.Prefix) != want.prefix ||
		req.Again != want.again || req.Seen != want.seen || req.Session != want.sess {
		t.Errorf("%q: got %v %q lease %d wait %d token %d owner %q limit %d prefix %q seen %d session %d, want %+v", in,
			req.Op, req.Key, req.Lease, req.Wait, req.Token, req.Owner, req.Limit, req.Prefix, req.Seen, req.Session, want)
	}
	if (want.owner == "") != (req.Owner == nil) || (want.prefix == "") != (req.Prefix == nil) {
		t.Errorf("%q: owner %q prefix %q: nil stands for none", in, req.Owner, req.Prefix)
	}
	if want.op == OpList || want.op == OpSession {
		if req.Key != nil {
			t.Errorf("%q: %v has key %q", in, want.op, req.Key)
		}
	} else if want.op == OpInfo || want.op == OpAuth {
		if req.Key != nil || req.EchoKey != nil {
			t.Errorf("%q: I has key %q, echo %q", in, req.Key, req.EchoKey)
		}
	} else if !bytes.Equal(req.EchoKey, req.Key) {
		t.Errorf("%q: EchoKey %q, Key %q", in, req.EchoKey, req.Key)
	}
	if len(req.EchoOp) != 1 || Op(req.EchoOp[0]) != req.Op {
		t.Errorf("%q: EchoOp %q for op %v", in, req.EchoOp, req.Op)
	}
}

// checkEcho checks the echo rules on a refused request.
func checkEcho(t *testing.T, in string, req *Request) {
	t.Helper()
	if o := req.EchoOp; o != nil && (len(o) == 0 || len(o) > 16 || !isPrint(o)) {
		t.Errorf("%q: EchoOp %q breaks the echo rule", in, o)
	}
	if k := req.EchoKey; k != nil && !ValidKey(k) {
		t.Errorf("%q: EchoKey %q is not a valid key", in, k)
	}
}

func TestParseRequestEchoNil(t *testing.T) {
	// "-" in an E line means nil echo fields, not empty ones.
	for _, in := range []string{"\n", " \n", "  \n", "\x01 \x02\n", "A \n"} {
		var req Request
		n, err := ParseRequest([]byte(in), nil, &req)
		if n != len(in) || err == nil {
			t.Errorf("%q: n %d err %v", in, n, err)
		}
		if in != "A \n" && req.EchoOp != nil {
			t.Errorf("%q: EchoOp %q, want nil", in, req.EchoOp)
		}
		if req.EchoKey != nil {
			t.Errorf("%q: EchoKey %q, want nil", in, req.EchoKey)
		}
	}
}

func TestParseRequestOverwrites(t *testing.T) {
	req := Request{Op: OpExtend, Key: []byte("old"), Lease: 1, Wait: 2, Token: 3, EchoOp: []byte("X"), EchoKey: []byte("old")}
	if _, err := ParseRequest([]byte("C k\n"), nil, &req); err != nil {
		t.Fatal(err)
	}
	if req.Lease != 0 || req.Wait != 0 || req.Token != 0 || string(req.Key) != "k" {
		t.Errorf("stale fields left: %+v", req)
	}
	req = Request{Op: OpExtend, Key: []byte("old"), Token: 3}
	if n, err := ParseRequest([]byte("A k 1"), nil, &req); n != 0 || err != nil || req.Key != nil || req.Token != 0 {
		t.Errorf("need-more left fields: %+v (n %d err %v)", req, n, err)
	}
}

func TestParseRequestNeedMore(t *testing.T) {
	for _, in := range []string{"", "A", "A k 30 5", "A k 30 5\r", "\r", strings.Repeat("x", MaxLine-1)} {
		var req Request
		if n, err := ParseRequest([]byte(in), nil, &req); n != 0 || err != nil {
			t.Errorf("%q: n %d err %v, want 0 nil", in, n, err)
		}
	}
}

func TestParseRequestLineLength(t *testing.T) {
	// A valid request padded to a given content length: the wait gets
	// leading zeros.
	line := func(content int) string {
		s := "A k 30 "
		return s + strings.Repeat("0", content-len(s))
	}
	for _, tc := range []struct {
		name string
		in   string
		n    int
		err  error
	}{
		{"511+LF", line(511) + "\n", 512, nil},
		{"510+CRLF", line(510) + "\r\n", 512, nil},
		{"511+CRLF", line(511) + "\r\n", 513, ErrLineTooLong},
		{"512+LF", line(512) + "\n", 513, ErrLineTooLong},
		{"600+LF", line(600) + "\n", 601, ErrLineTooLong},
		{"511 no LF", line(511), 0, nil},
		{"511+CR no LF", line(511) + "\r", 0, ErrLineTooLong},
		{"512 no LF", line(512), 0, ErrLineTooLong},
		{"4096 no LF", line(4096), 0, ErrLineTooLong},
		{"512 no LF then LF", line(512) + strings.Repeat("x", 100), 0, ErrLineTooLong},
	} {
		var req Request
		n, err := ParseRequest([]byte(tc.in), nil, &req)
		if n != tc.n || err != tc.err {
			t.Errorf("%s: n %d err %v, want %d %v", tc.name, n, err, tc.n, tc.err)
		}
		if err == nil && n > 0 && (req.Op != OpAcquire || req.Lease != 30000 || req.Wait != 0) {
			t.Errorf("%s: parsed %+v", tc.name, req)
		}
		if err == ErrLineTooLong {
			if got := string(AppendRefusal(nil, &req, err)); got != "E - - line too long\n" {
				t.Errorf("%s: answer %q", tc.name, got)
			}
		}
	}
}

// reqResult is one ParseRequest outcome, detached from its buffer.
type reqResult struct {
	n   int // -1 for ErrLineTooLong, whose n depends on how the bytes arrived
	err error
	req Request
}

func (r reqResult) String() string {
	return fmt.Sprintf("n=%d err=%v op=%q key=%q lease=%d wait=%d token=%d name=%q secret=%q owner=%q slots=%d shared=%v limit=%d prefix=%q echo=%q/%q",
		r.n, r.err, byte(r.req.Op), r.req.Key, r.req.Lease, r.req.Wait, r.req.Token, r.req.Name, r.req.Secret,
		r.req.Owner, r.req.Slots, r.req.Shared, r.req.Limit, r.req.Prefix, r.req.EchoOp, r.req.EchoKey)
}

func detach(n int, err error, req *Request) reqResult {
	if err == ErrLineTooLong {
		n = -1
	}
	r := *req
	r.Key = bytes.Clone(r.Key)
	r.EchoOp = bytes.Clone(r.EchoOp)
	r.EchoKey = bytes.Clone(r.EchoKey)
	r.Name = bytes.Clone(r.Name)
	r.Secret = bytes.Clone(r.Secret)
	return reqResult{n: n, err: err, req: r}
}

// requestParser is ParseRequest with lim, as a lineParser.
func requestParser(lim *Limits) lineParser[reqResult] {
	var req Request
	return func(b []byte) (reqResult, int, error) {
		n, err := ParseRequest(b, lim, &req)
		return detach(n, err, &req), n, err
	}
}

// lineParser parses the first line of b as ParseRequest or ParseAnswer do,
// and returns their n and error with the outcome detached from b.
type lineParser[T any] func(b []byte) (T, int, error)

// parseLines parses every complete line of data with parse, the way a caller
// with the whole input would, stopping at the first need-more (rest is what
// it left unparsed) or line too long.
func parseLines[T any](t testing.TB, data []byte, parse lineParser[T]) (out []T, rest []byte, tooLong bool) {
	for {
		r, n, err := parse(data)
		if n < 0 || n > len(data) {
			t.Fatalf("n = %d for %d bytes", n, len(data))
		}
		if n == 0 && err == nil {
			return out, data, false
		}
		out = append(out, r)
		if err == ErrLineTooLong {
			return out, nil, true
		}
		data = data[n:]
	}
}

// parseSplit feeds data to parse in chunks whose sizes come from cuts
// (cycled; a zero means one byte), each appended to what is still
// unparsed, the way a connection delivers its input.
func parseSplit[T any](t testing.TB, data, cuts []byte, parse lineParser[T]) (out []T, tooLong bool) {
	var pending []byte
	for i := 0; len(data) > 0; i++ {
		size := 1
		if len(cuts) > 0 {
			size = max(1, int(cuts[i%len(cuts)]))
		}
		size = min(size, len(data))
		pending = append(pending, data[:size]...)
		data = data[size:]
		var got []T
		got, pending, tooLong = parseLines(t, pending, parse)
		out = append(out, got...)
		if tooLong {
			return out, true
		}
	}
	return out, false
}

func compareResults[T fmt.Stringer](t *testing.T, whole, split []T, equal func(a, b T) bool) {
	t.Helper()
	if len(whole) != len(split) {
		t.Fatalf("whole gave %d results, split %d:\nwhole %v\nsplit %v", len(whole), len(split), whole, split)
	}
	for i := range whole {
		if !equal(whole[i], split[i]) {
			t.Fatalf("result %d: whole %v, split %v", i, whole[i], split[i])
		}
	}
}

func equalReqResult(a, b reqResult) bool {
	return a.n == b.n && a.err == b.err && equalRequest(&a.req, &b.req) &&
		bytes.Equal(a.req.EchoOp, b.req.EchoOp) && (a.req.EchoOp == nil) == (b.req.EchoOp == nil) &&
		bytes.Equal(a.req.EchoKey, b.req.EchoKey) && (a.req.EchoKey == nil) == (b.req.EchoKey == nil)
}

func equalRequest(a, b *Request) bool {
	eq := func(x, y []byte) bool { return bytes.Equal(x, y) && (x == nil) == (y == nil) }
	return a.Op == b.Op && bytes.Equal(a.Key, b.Key) && a.Lease == b.Lease && a.Wait == b.Wait && a.Token == b.Token &&
		bytes.Equal(a.Name, b.Name) && bytes.Equal(a.Secret, b.Secret) &&
		eq(a.Owner, b.Owner) && a.Limit == b.Limit && eq(a.Prefix, b.Prefix) &&
		a.Slots == b.Slots && a.Shared == b.Shared && a.Again == b.Again && a.Seen == b.Seen && a.Session == b.Session
}

const pipeline = "A orders/42 30 5\r\n" +
	"A orders/42 30 0.5\n" +
	"R orders/42 1001\n" +
	"X orders/42 1001 60\r\n" +
	"A orders/42 30 0 lots\n" +
	"\n" +
	"C orders/42\n" +
	"bogus\n" +
	"I\n" +
	"U app s3cret\n" +
	"R k 0\n"

func TestParseRequestSplit(t *testing.T) {
	whole, _, tooLong := parseLines(t, []byte(pipeline), requestParser(nil))
	if len(whole) != 11 || tooLong {
		t.Fatalf("whole pipeline gave %d results (too long %v)", len(whole), tooLong)
	}
	for _, cuts := range [][]byte{{1}, {2}, {3}, {5, 1, 7}, {17}, {255}} {
		split, tooLong := parseSplit(t, []byte(pipeline), cuts, requestParser(nil))
		if tooLong {
			t.Fatalf("cuts %v: too long", cuts)
		}
		compareResults(t, whole, split, equalReqResult)
	}
	// Bytes after the last LF stay unparsed, whole or split.
	whole2, _, _ := parseLines(t, []byte(pipeline+"A k 1"), requestParser(nil))
	split2, _ := parseSplit(t, []byte(pipeline+"A k 1"), []byte{1}, requestParser(nil))
	compareResults(t, whole, whole2, equalReqResult)
	compareResults(t, whole, split2, equalReqResult)
}

func TestRequestRoundTrip(t *testing.T) {
	long := bytes.Repeat([]byte{'z'}, MaxKey)
	for _, want := range []Request{
		{Op: OpAcquire, Key: []byte("orders/42"), Lease: 30000, Wait: 5000},
		{Op: OpAcquire, Key: []byte("k"), Lease: 1, Wait: 0},
		{Op: OpAcquire, Key: []byte("ключ"), Lease: 2125, Wait: 86400000},
		{Op: OpAcquire, Key: long, Lease: 86400000, Wait: 86399999},
		{Op: OpRelease, Key: []byte("orders/42"), Token: 1001},
		{Op: OpRelease, Key: long, Token: 1<<64 - 1},
		{Op: OpExtend, Key: []byte("k"), Token: 1, Lease: 10},
		{Op: OpExtend, Key: long, Token: 1<<64 - 1, Lease: 86400000},
		{Op: OpCancel, Key: []byte("k")},
		{Op: OpCancel, Key: long},
		{Op: OpInfo},
		{Op: OpAcquire, Key: []byte("k"), Lease: 1, Wait: NoWait},
		{Op: OpAcquire, Key: long, Lease: 86400000, Wait: 86399999, Owner: bytes.Repeat([]byte{'~'}, MaxOwner)},
		{Op: OpAcquire, Key: []byte("k"), Lease: 30000, Wait: NoWait, Owner: []byte("web-3:4121")},
		{Op: OpInspect, Key: []byte("k")},
		{Op: OpInspect, Key: long},
		{Op: OpList},
		{Op: OpList, Limit: 1<<64 - 1, Prefix: long},
		{Op: OpList, Limit: 100, Prefix: []byte("orders/")},
		{Op: OpSession, Session: 1},
		{Op: OpSession, Session: 1<<64 - 1},
		{Op: OpAcquire, Key: []byte("k"), Lease: 30000, Wait: 5000, Again: true, Seen: 1041},
		{Op: OpAcquire, Key: []byte("k"), Lease: 30000, Wait: 5000, Again: true},
		{Op: OpAcquire, Key: long, Lease: 1, Wait: NoWait, Owner: bytes.Repeat([]byte{'~'}, MaxOwner), Slots: 1024, Again: true, Seen: 1<<64 - 1},
		{Op: OpAcquire, Key: []byte("doc"), Lease: 30000, Wait: 0, Shared: true, Again: true, Seen: 9},
		{Op: OpAcquire, Key: []byte("doc"), Lease: 30000, Wait: 0, Slots: 3},
	} {
		line := appendRequest(nil, &want)
		var got Request
		n, err := ParseRequest(line, nil, &got)
		if n != len(line) || err != nil || !equalRequest(&got, &want) {
			t.Errorf("%q: n %d err %v, got %+v want %+v", line, n, err, got, want)
		}
		if len(line) > MaxLine {
			t.Errorf("%q: %d bytes", line, len(line))
		}
	}
}

// appendRequest encodes req with the request encoder for its op.
func appendRequest(dst []byte, req *Request) []byte {
	switch req.Op {
	case OpAcquire:
		if req.Again {
			return AppendAcquireSeen(dst, req.Key, req.Owner, req.Lease, req.Wait, req.Slots, req.Shared, req.Seen)
		}
		return AppendAcquireMode(dst, req.Key, req.Owner, req.Lease, req.Wait, req.Slots, req.Shared)
	case OpSession:
		return AppendSession(dst, req.Session)
	case OpInspect:
		return AppendInspect(dst, req.Key)
	case OpList:
		return AppendList(dst, req.Limit, req.Prefix)
	case OpRelease:
		return AppendRelease(dst, req.Key, req.Token)
	case OpExtend:
		return AppendExtend(dst, req.Key, req.Token, req.Lease)
	case OpCancel:
		return AppendCancel(dst, req.Key)
	case OpInfo:
		return AppendInfoRequest(dst)
	case OpAuth:
		return AppendAuth(dst, req.Name, req.Secret)
	}
	panic("appendRequest: op " + req.Op.String())
}

func TestRequestEncoders(t *testing.T) {
	k := []byte("orders/42")
	for _, tc := range []struct{ got, want string }{
		{string(AppendAcquire(nil, k, 30000, 5000)), "A orders/42 30 5\n"},
		{string(AppendAcquire(nil, k, 30000, 500)), "A orders/42 30 0.5\n"},
		{string(AppendAcquire([]byte("x"), k, 2125, 0)), "xA orders/42 2.125 0\n"},
		{string(AppendRelease(nil, k, 1001)), "R orders/42 1001\n"},
		{string(AppendExtend(nil, k, 1001, 60000)), "X orders/42 1001 60\n"},
		{string(AppendCancel(nil, k)), "C orders/42\n"},
		{string(AppendInfoRequest(nil)), "I\n"},
		{string(AppendAuth(nil, []byte("app"), []byte("s3cret"))), "U app s3cret\n"},
		{string(AppendAcquire(nil, k, 30000, NoWait)), "A orders/42 30 -\n"},
		{string(AppendAcquireOwner(nil, k, []byte("web-3:4121"), 30000, 0)), "A orders/42 30 0 owner=web-3:4121\n"},
		{string(AppendAcquireMode(nil, k, []byte("w"), 30000, 0, 3, false)), "A orders/42 30 0 owner=w limit=3\n"},
		{string(AppendAcquireMode(nil, k, nil, 30000, NoWait, 0, true)), "A orders/42 30 - mode=shared\n"},
		{string(AppendAcquireMode(nil, k, nil, 30000, 1, 0, false)), "A orders/42 30 0.001\n"},
		{string(AppendAcquireOwner(nil, k, nil, 30000, NoWait)), "A orders/42 30 -\n"},
		{string(AppendWait(nil, 1500)), "1.5"},
		{string(AppendInspect(nil, k)), "Q orders/42\n"},
		{string(AppendList(nil, 0, nil)), "L 0\n"},
		{string(AppendList(nil, 100, []byte("orders/"))), "L 100 orders/\n"},
		{string(AppendSession(nil, 8841)), "S 8841\n"},
		{string(AppendAcquireSeen(nil, k, nil, 30000, 5000, 0, false, 1041)), "A orders/42 30 5 seen=1041\n"},
		{string(AppendAcquireSeen(nil, k, []byte("w"), 30000, NoWait, 0, true, 7)), "A orders/42 30 - owner=w mode=shared seen=7\n"},
		{string(AppendAcquireSeen(nil, k, nil, 30000, 0, 2, false, 0)), "A orders/42 30 0 limit=2 seen=0\n"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestOpString(t *testing.T) {
	for op, s := range map[Op]string{OpAcquire: "A", OpRelease: "R", OpExtend: "X", OpCancel: "C", OpInfo: "I", OpAuth: "U",
		OpInspect: "Q", OpList: "L", OpSession: "S", 'z': "?"} {
		if op.String() != s {
			t.Errorf("Op(%q).String() = %q", byte(op), op.String())
		}
	}
}

func TestValidKey(t *testing.T) {
	for _, tc := range []struct {
		k  string
		ok bool
	}{
		{"", false}, {"k", true}, {"!", true}, {"~", true}, {"\x7f", false}, {" ", false},
		{"a b", false}, {"\x00", false}, {"\x80", true}, {"é", true},
		{strings.Repeat("k", MaxKey), true}, {strings.Repeat("k", MaxKey+1), false},
	} {
		if ValidKey([]byte(tc.k)) != tc.ok {
			t.Errorf("ValidKey(%q) = %v", tc.k, !tc.ok)
		}
	}
}

func TestParseRequestAllocs(t *testing.T) {
	lim := &Limits{}
	for _, line := range []string{
		"A orders/42 30 5\n", "R orders/42 1001\n", "X orders/42 1001 2.5\n", "C orders/42\n", "I\n",
		"U app s3cret\n", "U app\n", "U app s3cret x\n", "A orders/42 30 0 lots\n", "Z\n", "A k 30", strings.Repeat("x", 600),
		"A orders/42 30 - owner=web-3:4121\n", "A k 30 0 owner=\x01\n", "Q orders/42\n", "L 100 orders/\n", "L x\n",
	} {
		buf := []byte(line)
		var req Request
		if a := testing.AllocsPerRun(100, func() { ParseRequest(buf, lim, &req) }); a != 0 {
			t.Errorf("ParseRequest(%q): %v allocs", line, a)
		}
	}
}

func TestErrorsIsSentinel(t *testing.T) {
	var req Request
	_, err := ParseRequest([]byte("A k 0 1\n"), nil, &req)
	if !errors.Is(fmt.Errorf("server: %w", err), ErrBadLease) {
		t.Errorf("err %v is not ErrBadLease", err)
	}
}

// cutKey, which tests eight bytes at a time, splits and judges a field as
// a byte-by-byte reading does, wherever a space, a control byte or DEL
// falls in or around a word.
func TestCutKeyMatchesByteByByte(t *testing.T) {
	naive := func(b []byte) (field, rest []byte, more, ok bool) {
		i := bytes.IndexByte(b, ' ')
		field, more = b, i >= 0
		if more {
			field, rest = b[:i], b[i+1:]
		}
		ok = len(field) > 0 && len(field) <= MaxKey
		for _, c := range field {
			ok = ok && isKeyByte(c)
		}
		return field, rest, more, ok
	}
	for n := 0; n <= 26; n++ {
		for p := -1; p < n; p++ {
			for _, c := range []byte{' ', 0, '\t', 0x7f, 0x80} {
				b := []byte(strings.Repeat("k", n) + " 30 0")
				if p >= 0 {
					b[p] = c
				}
				f, r, m, ok := cutKey(b)
				nf, nr, nm, nok := naive(b)
				if !bytes.Equal(f, nf) || !bytes.Equal(r, nr) || m != nm || ok != nok {
					t.Fatalf("cutKey(%q) = %q %q %v %v, want %q %q %v %v", b, f, r, m, ok, nf, nr, nm, nok)
				}
			}
		}
	}
}
