package wire_test

import (
	"fmt"

	"github.com/kunci/kunci/wire"
)

// A server's read loop: parse every complete line in the buffer, answer
// each, and keep the rest for the next read.
func ExampleParseRequest() {
	in := []byte("A orders/42 30 0.5\r\nR orders/42 1001\nA orders/42 30 0 lots\nI\nC orde")
	var out []byte
	var req wire.Request
	for {
		n, err := wire.ParseRequest(in, nil, &req)
		if n == 0 && err == nil {
			break // need more bytes
		}
		if err != nil {
			out = wire.AppendRefusal(out, &req, err)
			if err == wire.ErrLineTooLong {
				break // and close the connection
			}
		} else {
			switch req.Op {
			case wire.OpAcquire:
				fmt.Printf("acquire %s lease %dms wait %dms\n", req.Key, req.Lease, req.Wait)
				out = wire.AppendGrant(out, req.Key, 1001)
			case wire.OpRelease:
				fmt.Printf("release %s token %d\n", req.Key, req.Token)
				out = wire.AppendReleased(out, req.Key, true)
			case wire.OpInfo:
				out = wire.AppendInfo(out, "active", "node1:7070", "node1:7070")
			}
		}
		in = in[n:]
	}
	fmt.Printf("%s", out)
	fmt.Printf("left: %q\n", in)
	// Output:
	// acquire orders/42 lease 30000ms wait 500ms
	// release orders/42 token 1001
	// A orders/42 1001
	// R orders/42 OK
	// E A orders/42 too many fields
	// I active node1:7070 node1:7070
	// left: "C orde"
}

// A client reading answers.
func ExampleParseAnswer() {
	in := []byte("A orders/42 1001\nT jobs/7\nE X - bad key\nM node2:7070\n")
	var a wire.Answer
	for {
		n, err := wire.ParseAnswer(in, &a)
		if n == 0 {
			break
		}
		in = in[n:]
		if err != nil {
			fmt.Println("bad line:", err)
			continue
		}
		switch a.Kind {
		case 'A':
			fmt.Printf("granted %s, token %d\n", a.Key, a.Token)
		case 'T':
			fmt.Printf("gave up waiting for %s\n", a.Key)
		case 'E':
			fmt.Printf("refused %s %q: %s\n", a.Op, a.Key, a.Text)
		case 'M':
			fmt.Printf("go to %s\n", a.Text)
		}
	}
	// Output:
	// granted orders/42, token 1001
	// gave up waiting for jobs/7
	// refused X "": bad key
	// go to node2:7070
}

func ExampleAppendSeconds() {
	for _, ms := range []int64{30000, 500, 2125, 0} {
		fmt.Printf("%s ", wire.AppendSeconds(nil, ms))
	}
	fmt.Println()
	// Output: 30 0.5 2.125 0
}
