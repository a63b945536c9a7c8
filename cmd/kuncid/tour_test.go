package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestREADMEInOrder follows the README as a newcomer does, against one
// node as `make run` starts it (on a free port): the session with `nc`,
// each connection as shown, every answer as shown (lease times aside; a
// listing's H lines in any order), and then the shell block of "From a
// shell" on the same node, as pasted into a shell. A section that leaves
// the node in a state the next one does not expect (a key still held)
// fails here.
func TestREADMEInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's sessions against a node")
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	p := start(t, "")
	defaultAddr := makeRunAddrs(t)["make run --listen"]

	// The session with nc.
	tour := fencedBlock(t, section(t, readme, "A session with `nc`"), "")
	tour = strings.ReplaceAll(tour, defaultAddr, p.addr)
	conns := 0
	for i, session := range strings.Split(tour, "$ nc ")[1:] {
		lines := strings.Split(session, "\n")
		if f := strings.Fields(lines[0]); len(f) != 2 || net.JoinHostPort(f[0], f[1]) != defaultAddr {
			t.Fatalf("nc session %d connects to %q, not to make run's node (%s)", i+1, lines[0], defaultAddr)
		}
		replayNC(t, p.addr, i+1, lines[1:])
		conns++
	}
	if conns < 3 {
		t.Fatalf("found %d nc sessions in the README", conns)
	}

	// From a shell, next, on the same node: bin/kunci is make build's.
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "kunci"), "../kunci").CombinedOutput(); err != nil {
		t.Fatalf("building kunci: %v\n%s", err, out)
	}
	blocks := shellBlocksIn(section(t, readme, "From a shell"))
	if len(blocks) != 1 {
		t.Fatalf("From a shell has %d shell blocks, want 1", len(blocks))
	}
	script := []string{"set -e"}
	for _, line := range blocks[0] {
		script = append(script, strings.ReplaceAll(line, "bin/kunci ", filepath.Join(bin, "kunci")+" "))
	}
	cmd := exec.Command("bash", "-c", strings.Join(script, "\n"))
	cmd.Dir = t.TempDir()
	clearKunciEnv(t)
	cmd.Env = append(os.Environ(), "KUNCI_ADDRS="+p.addr, "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("From a shell, run after the nc session: %v\nscript:\n%s\noutput:\n%s", err, strings.Join(script, "\n"), out)
	}
	t.Logf("From a shell:\n%s", out)
}

// section returns the text of the README section under "## heading", up
// to the next "## ".
func section(t *testing.T, md, heading string) string {
	t.Helper()
	_, s, ok := strings.Cut(md, "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	s, _, _ = strings.Cut(s, "\n## ")
	return s
}

// fencedBlock returns the first ``` block of s with the info string lang
// ("" for none).
func fencedBlock(t *testing.T, s, lang string) string {
	t.Helper()
	_, b, ok := strings.Cut(s, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("no ```%s block in %q", lang, s)
	}
	b, _, _ = strings.Cut(b, "\n```")
	return b
}

// A transcript line's comment: two or more spaces, then "#".
var ncComment = regexp.MustCompile(`\s{2,}#.*$`)

// replayNC plays one nc connection of the README on a connection to addr:
// each request line is sent, and each answer line must be the node's next
// answer.
func replayNC(t *testing.T, addr string, session int, lines []string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := bufio.NewReader(nc)
	next := func(want string) string {
		t.Helper()
		_ = nc.SetReadDeadline(time.Now().Add(15 * time.Second))
		got, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("nc session %d: waiting for %q: %v", session, want, err)
		}
		return strings.TrimSuffix(got, "\n")
	}
	listing := false // an L request is outstanding
	var wantH, gotH []string
	for _, line := range lines {
		line = strings.TrimSpace(ncComment.ReplaceAllString(line, ""))
		if line == "" || line == "^C" {
			continue
		}
		if isRequest(line, listing) {
			if _, err := nc.Write([]byte(line + "\n")); err != nil {
				t.Fatal(err)
			}
			listing = listing || line[0] == 'L'
			continue
		}
		got := next(line)
		if line[0] == 'H' {
			wantH, gotH = append(wantH, line), append(gotH, got)
			continue
		}
		if line[0] == 'L' {
			listing = false
			// The listing's order is the node's table order: compare as sets.
			slices.Sort(gotH)
			slices.Sort(wantH)
			if len(gotH) != len(wantH) {
				t.Fatalf("nc session %d: the node listed %q, README %q", session, gotH, wantH)
			}
			for i := range wantH {
				if !sameAnswer(wantH[i], gotH[i]) {
					t.Fatalf("nc session %d: the node listed %q, README %q", session, gotH, wantH)
				}
			}
			wantH, gotH = nil, nil
		}
		if !sameAnswer(line, got) {
			t.Fatalf("nc session %d: the node answered %q where the README shows %q", session, got, line)
		}
	}
}

// isRequest tells a request line of a transcript from an answer line by
// its shape: an answer has fewer fields than the request of its letter
// (A key token, R key OK), or another letter (T, E, H); an L line is the
// answer while a listing is outstanding.
func isRequest(line string, listing bool) bool {
	f := strings.Fields(line)
	switch f[0] {
	case "A":
		return len(f) >= 4
	case "R":
		return len(f) == 3 && f[2] != "OK" && f[2] != "STALE"
	case "X":
		return len(f) == 4
	case "C", "Q":
		return len(f) == 2
	case "I":
		return len(f) == 1
	case "L":
		return !listing
	}
	return false
}

// A lease time left, which the README shows as one reading.
var secondsLeft = regexp.MustCompile(`^\d+\.\d+$`)

// sameAnswer: got is the answer the README shows as want, lease times
// left aside.
func sameAnswer(want, got string) bool {
	w, g := strings.Fields(want), strings.Fields(got)
	if len(w) != len(g) {
		return false
	}
	for i := range w {
		if w[i] != g[i] && !(secondsLeft.MatchString(w[i]) && regexp.MustCompile(`^\d+(\.\d+)?$`).MatchString(g[i])) {
			return false
		}
	}
	return true
}
