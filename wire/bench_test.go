package wire

import "testing"

func BenchmarkParseRequest(b *testing.B) {
	lim := &Limits{}
	for _, bc := range []struct{ name, line string }{
		{"A", "A orders/42 30 0.5\n"},
		{"R", "R orders/42 1001\n"},
		{"X", "X orders/42 1001 2.125\n"},
		{"C", "C orders/42\n"},
		{"I", "I\n"},
		{"A/CRLF", "A orders/42 30 0.5\r\n"},
		{"A/key=64", "A tenant-0042/orders/2024-11-30/shipment/0000000000000000000042 30 5\n"},
		{"refusal", "A orders/42 30 0 lots\n"},
	} {
		buf := []byte(bc.line)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			var req Request
			for b.Loop() {
				ParseRequest(buf, lim, &req)
			}
		})
	}
}

func BenchmarkParseAnswer(b *testing.B) {
	for _, bc := range []struct{ name, line string }{
		{"A", "A orders/42 1001\n"},
		{"T", "T orders/42\n"},
		{"R", "R orders/42 OK\n"},
		{"E", "E A orders/42 too many waiters\n"},
		{"I", "I active node1:7070 node1:7070\n"},
	} {
		buf := []byte(bc.line)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			var a Answer
			for b.Loop() {
				ParseAnswer(buf, &a)
			}
		})
	}
}

var benchKey = []byte("orders/42")

// benchAppend runs an encoder into a reused buffer.
func benchAppend(b *testing.B, f func(dst []byte) []byte) {
	b.ReportAllocs()
	dst := make([]byte, 0, 256)
	for b.Loop() {
		dst = f(dst[:0])
	}
	b.SetBytes(int64(len(dst)))
}

func BenchmarkAppendGrant(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendGrant(d, benchKey, 1234567890123) })
}

func BenchmarkAppendTimeout(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendTimeout(d, benchKey) })
}

func BenchmarkAppendReleased(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendReleased(d, benchKey, true) })
}

func BenchmarkAppendCancelled(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendCancelled(d, benchKey, false) })
}

func BenchmarkAppendInfo(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendInfo(d, "active", "node1:7070", "node1:7070") })
}

func BenchmarkAppendRedirect(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendRedirect(d, "node1:7070") })
}

func BenchmarkAppendError(b *testing.B) {
	req := &Request{EchoOp: []byte("A"), EchoKey: benchKey}
	benchAppend(b, func(d []byte) []byte { return AppendRefusal(d, req, ErrTooManyFields) })
}

func BenchmarkAppendAcquire(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendAcquire(d, benchKey, 30000, 2125) })
}

func BenchmarkAppendRelease(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendRelease(d, benchKey, 1234567890123) })
}

func BenchmarkAppendExtend(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendExtend(d, benchKey, 1234567890123, 30000) })
}

func BenchmarkAppendCancel(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendCancel(d, benchKey) })
}

func BenchmarkAppendSeconds(b *testing.B) {
	benchAppend(b, func(d []byte) []byte { return AppendSeconds(d, 86399999) })
}

func BenchmarkParseSeconds(b *testing.B) {
	b.ReportAllocs()
	s := []byte("86399.999")
	for b.Loop() {
		ParseSeconds(s)
	}
}
