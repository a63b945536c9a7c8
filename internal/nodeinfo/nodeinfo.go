// Package nodeinfo asks a kunci node what it is: the one-line answer to
// "I" (docs/PROTOCOL.md), for tools and tests that wait on a node's role.
package nodeinfo

import (
	"bufio"
	"net"
	"strings"
	"time"
)

// Ask returns the answer of the node at addr to I, without its LF; ""
// when it gives none within timeout (not up, or a process stopped).
func Ask(addr string, timeout time.Duration) string {
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return ""
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(timeout))
	if _, err := nc.Write([]byte("I\n")); err != nil {
		return ""
	}
	s, _ := bufio.NewReader(nc).ReadString('\n')
	return strings.TrimSuffix(s, "\n")
}
