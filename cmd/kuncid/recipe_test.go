package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kunci/kunci/internal/testnode"
	"github.com/kunci/kunci/server"
)

// The documents a new user follows, read as a user would run them: every
// kuncid command line of a shell block in the READMEs, every env file in
// deploy/, and the Makefile's `make run`.

// repoRoot is the repository, two levels above this package.
const repoRoot = "../.."

// makeRunAddrs returns the addresses `make run` binds: LISTEN and ADMIN
// from the Makefile.
func makeRunAddrs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	for _, name := range []string{"LISTEN", "ADMIN"} {
		m := regexp.MustCompile(`(?m)^` + name + `\s*\?=\s*(\S+)\s*$`).FindStringSubmatch(string(b))
		if m == nil {
			t.Fatalf("Makefile sets no %s", name)
		}
		addrs["make run --"+strings.ToLower(name)] = m[1]
	}
	if !strings.Contains(string(b), "--listen $(LISTEN) --admin $(ADMIN)") {
		t.Fatal("make run no longer passes --listen $(LISTEN) --admin $(ADMIN): update this test")
	}
	return addrs
}

// shellBlocks returns the ```sh blocks of a Markdown file, each as its
// command lines (continuation lines joined, comments dropped).
func shellBlocks(t *testing.T, file string) [][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return shellBlocksIn(string(b))
}

// shellBlocksIn returns the ```sh blocks of Markdown text md, as
// shellBlocks does.
func shellBlocksIn(md string) [][]string {
	var blocks [][]string
	var cur []string
	in, cont := false, ""
	sc := bufio.NewScanner(strings.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.HasPrefix(line, "```sh"):
			in, cur = true, nil
		case in && strings.HasPrefix(line, "```"):
			in = false
			blocks = append(blocks, cur)
		case in:
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			line = strings.TrimSpace(line)
			if strings.HasSuffix(line, `\`) {
				cont += strings.TrimSuffix(line, `\`) + " "
				continue
			}
			if line = cont + line; line != "" {
				cur = append(cur, line)
			}
			cont = ""
		}
	}
	return blocks
}

// recipeNode is one kuncid of a recipe.
type recipeNode struct {
	where string // file and line, for messages
	cfg   server.Config
}

// parseCommand parses a kuncid command line with kuncid's own flags.
func parseCommand(t *testing.T, where string, fields []string) recipeNode {
	t.Helper()
	clearKunciEnv(t)
	args := slices.DeleteFunc(slices.Clone(fields[1:]), func(s string) bool { return s == "&" })
	// The recipe makes its key file when it runs (TestClusterRecipeRuns
	// runs it); here a key of the test's stands in for it.
	for i, a := range args {
		if (a == "--cluster-key-file" || a == "--cluster-key-file-old") && i+1 < len(args) {
			args[i+1] = testKeyFile(t)
		}
	}
	cfg, _, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return recipeNode{where: where, cfg: cfg}
}

// testKeyFile writes a cluster key file as kuncid wants it (mode 0600).
func testKeyFile(t *testing.T) string {
	t.Helper()
	return testFile(t, "cluster.key", "a test cluster key of 32 bytes.\n")
}

// testAuthFile writes a credentials file (kuncid --auth-file).
func testAuthFile(t *testing.T) string {
	t.Helper()
	return testFile(t, "auth", "billing a-test-secret-of-some-length\n")
}

// testFile writes content to a new file name, mode 600.
func testFile(t *testing.T, name, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// clearKunciEnv unsets the test's own KUNCI_ variables for the test.
func clearKunciEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "KUNCI_") {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
}

// readEnvFile returns the KEY=VALUE settings of an env file.
func readEnvFile(t *testing.T, file string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s:%d: not KEY=VALUE: %q", file, i+1, line)
		}
		env[k] = v
	}
	return env
}

// parseEnvFile parses an env file as kuncid reads it from the environment.
func parseEnvFile(t *testing.T, file string) recipeNode {
	t.Helper()
	return recipeNode{where: file, cfg: configFromEnv(t, file, readEnvFile(t, file))}
}

// configFromEnv makes env's KUNCI_ variables kuncid's whole environment
// (the cluster key and auth files are files of the test's, as an install
// makes them), parses it as kuncid does, and checks the Config as the node
// does before it binds anything; where names env in failures.
func configFromEnv(t *testing.T, where string, env map[string]string) server.Config {
	t.Helper()
	clearKunciEnv(t)
	for k, v := range env {
		switch {
		case !strings.HasPrefix(k, "KUNCI_"):
			continue
		case k == "KUNCI_CLUSTER_KEY_FILE" || k == "KUNCI_CLUSTER_KEY_FILE_OLD":
			v = testKeyFile(t)
		case k == "KUNCI_AUTH_FILE":
			v = testAuthFile(t)
		}
		t.Setenv(k, v)
	}
	cfg, _, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if _, err := server.New(cfg); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	return cfg
}

// sameSocket reports whether two listen addresses would take the same
// port on one machine: same port, and hosts that are equal, both loopback,
// or one of them every address.
func sameSocket(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb || pa == "0" {
		return false
	}
	loopback := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "localhost" || ip != nil && ip.IsLoopback()
	}
	any := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "" || ip != nil && ip.IsUnspecified()
	}
	return ha == hb || loopback(ha) && loopback(hb) || any(ha) || any(hb)
}

// binds lists what a node binds, named for messages.
func (n recipeNode) binds() map[string]string {
	b := map[string]string{n.where + " --listen": n.cfg.Listen}
	if n.cfg.Admin != "" {
		b[n.where+" --admin"] = n.cfg.Admin
	}
	if n.cfg.TLSListen != "" {
		b[n.where+" --tls-listen"] = n.cfg.TLSListen
	}
	return b
}

// checkNoClash fails on two of the named addresses that take the same port.
func checkNoClash(t *testing.T, addrs map[string]string) {
	t.Helper()
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range addrs {
			if !yield(k) {
				return
			}
		}
	})
	for i, a := range names {
		for _, b := range names[i+1:] {
			if sameSocket(addrs[a], addrs[b]) {
				t.Errorf("port clash: %s %s and %s %s", a, addrs[a], b, addrs[b])
			}
		}
	}
}

// checkCluster checks a recipe's nodes against each other: every node is
// in the same --peers list under its --advertise, the list names exactly
// the nodes, and their data directories differ.
func checkCluster(t *testing.T, nodes []recipeNode) {
	t.Helper()
	var advertised, dirs []string
	for _, n := range nodes {
		self := n.cfg.Advertise
		if self == "" {
			self = n.cfg.Listen
		}
		advertised = append(advertised, self)
		if !slices.Equal(n.cfg.Peers, nodes[0].cfg.Peers) {
			t.Errorf("%s: --peers %v, not the same list as %s's %v", n.where, n.cfg.Peers, nodes[0].where, nodes[0].cfg.Peers)
		}
		if !slices.Contains(n.cfg.Peers, self) {
			t.Errorf("%s: its address %s is not in --peers %v", n.where, self, n.cfg.Peers)
		}
		if n.cfg.DataDir == "" {
			t.Errorf("%s: a cluster node without a data directory", n.where)
		} else if slices.Contains(dirs, n.cfg.DataDir) && !strings.HasPrefix(n.cfg.DataDir, "/var/lib/") {
			t.Errorf("%s: data directory %s is another node's too", n.where, n.cfg.DataDir)
		}
		dirs = append(dirs, n.cfg.DataDir)
	}
	if !slices.Equal(slices.Sorted(slices.Values(advertised)), slices.Sorted(slices.Values(nodes[0].cfg.Peers))) {
		t.Errorf("the nodes %v are not the peer list %v", advertised, nodes[0].cfg.Peers)
	}
}

// TestRecipesDoNotClash runs through every shell block of README.md,
// docs/*.md and deploy/README.md that starts kuncid. A block whose nodes all listen on
// loopback is a recipe run on one machine beside `make run`, which the
// README says to keep running: no two of its nodes, and none of them and
// `make run`, take the same port, and the kunci status it runs asks those
// nodes, with --wait (nodes started with & are not listening yet). Every
// block's cluster is consistent.
func TestRecipesDoNotClash(t *testing.T) {
	makeRun := makeRunAddrs(t)
	local := 0
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range docs {
		docs[i], _ = filepath.Rel(repoRoot, docs[i])
	}
	for _, doc := range append([]string{"README.md", "deploy/README.md"}, docs...) {
		for bi, block := range shellBlocks(t, filepath.Join(repoRoot, doc)) {
			var nodes []recipeNode
			var status [][]string
			for li, line := range block {
				f := strings.Fields(line)
				switch {
				case len(f) > 0 && (f[0] == "kuncid" || strings.HasSuffix(f[0], "/kuncid")) &&
					!slices.Contains(f, "--version") && !slices.Contains(f, "--help"):
					nodes = append(nodes, parseCommand(t, fmt.Sprintf("%s block %d line %d", doc, bi+1, li+1), f))
				case len(f) > 1 && f[0] == "kunci" && f[1] == "status":
					status = append(status, f)
				}
			}
			if len(nodes) == 0 {
				continue
			}
			binds := map[string]string{}
			onLoopback := true
			for _, n := range nodes {
				for k, v := range n.binds() {
					binds[k] = v
				}
				// A node that also serves TLS on another address is a
				// machine's, not a recipe's (its plain port is for local
				// tools only).
				for _, a := range []string{n.cfg.Listen, n.cfg.TLSListen} {
					if a == "" {
						continue
					}
					host, _, _ := net.SplitHostPort(a)
					if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
						onLoopback = false
					}
				}
			}
			if onLoopback {
				local++
				for k, v := range makeRun {
					binds[k] = v
				}
			}
			checkNoClash(t, binds)
			if len(nodes) == 1 {
				if p := nodes[0].cfg.Peers; len(p) > 0 && !slices.Contains(p, cmp.Or(nodes[0].cfg.Advertise, nodes[0].cfg.Listen)) {
					t.Errorf("%s: not in its own --peers %v", nodes[0].where, p)
				}
				continue
			}
			checkCluster(t, nodes)
			if len(status) == 0 {
				t.Errorf("%s block %d starts a cluster but does not run kunci status", doc, bi+1)
			}
			for _, f := range status {
				i := slices.Index(f, "--addrs")
				if i < 0 || i+1 >= len(f) || !slices.Equal(strings.Split(f[i+1], ","), nodes[0].cfg.Peers) {
					t.Errorf("%s block %d: %q does not ask the nodes it started (%v)", doc, bi+1, strings.Join(f, " "), nodes[0].cfg.Peers)
				}
				if !slices.Contains(f, "--wait") {
					t.Errorf("%s block %d: %q right after starting nodes needs --wait", doc, bi+1, strings.Join(f, " "))
				}
			}
		}
	}
	if local == 0 {
		t.Fatal("found no shell block in README.md or deploy/README.md that starts kuncid on loopback: where did the cluster recipe go?")
	}
}

// TestDeployEnvFiles reads deploy/'s env files as kuncid would: each one
// parses, a node's listen and admin ports differ (also from the other
// nodes on its machine), the admin endpoint is on loopback (the steps
// check /readyz and the lag metrics there; nothing else should reach
// it), and the three nodes make one cluster.
func TestDeployEnvFiles(t *testing.T) {
	single := parseEnvFile(t, filepath.Join(repoRoot, "deploy/kuncid.env"))
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy/three-node/*.env"))
	if err != nil || len(files) != 3 {
		t.Fatalf("deploy/three-node: %v %v, want three env files", files, err)
	}
	var cluster []recipeNode
	for _, f := range files {
		cluster = append(cluster, parseEnvFile(t, f))
	}
	for _, n := range append([]recipeNode{single}, cluster...) {
		checkNoClash(t, n.binds())
		host, _, err := net.SplitHostPort(n.cfg.Admin)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("%s: KUNCI_ADMIN %q, want a loopback address", n.where, n.cfg.Admin)
		}
	}
	all := map[string]string{}
	for _, n := range cluster {
		for k, v := range n.binds() {
			all[k] = v
		}
	}
	// Loopback addresses of different machines do not meet.
	for k, v := range all {
		if host, _, err := net.SplitHostPort(v); err == nil {
			if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
				delete(all, k)
			}
		}
	}
	checkNoClash(t, all)
	checkCluster(t, cluster)
}

// TestClusterRecipeRuns runs the README's Cluster recipe as a user pastes
// it into a shell, with the binaries on PATH instead of `make build` and
// free ports instead of its own (other tests may run beside this one):
// the three nodes start and kunci status --wait finds one active that all
// name.
func TestClusterRecipeRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three kuncid processes")
	}
	var recipe []string
	for _, block := range shellBlocks(t, filepath.Join(repoRoot, "README.md")) {
		for _, line := range block {
			if strings.HasPrefix(line, "kuncid ") && strings.Contains(line, "--peers") {
				recipe = block
			}
		}
	}
	if recipe == nil {
		t.Fatal("README.md has no shell block starting a cluster")
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "kunci"), "../kunci").CombinedOutput(); err != nil {
		t.Fatalf("building kunci: %v\n%s", err, out)
	}
	if err := os.Symlink(kuncid, filepath.Join(bin, "kuncid")); err != nil {
		t.Fatal(err)
	}
	// Each address of the recipe gets a free port of its own: the
	// listeners that found them stay open until all are found, or the
	// kernel could hand the same port out twice.
	ports := map[string]string{}
	var held []net.Listener
	script := []string{"set -e", `export PATH="` + bin + `:$PATH"`}
	for _, line := range recipe {
		if strings.HasPrefix(line, "make ") {
			continue
		}
		line = regexp.MustCompile(`127\.0\.0\.1:\d+`).ReplaceAllStringFunc(line, func(a string) string {
			if ports[a] == "" {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
				ports[a] = l.Addr().String()
			}
			return ports[a]
		})
		script = append(script, line)
	}
	for _, l := range held {
		l.Close()
	}
	// Stop the nodes as the README says, also when a line failed.
	script = slices.Insert(script, 1, `trap 'set +e; kill %2 %3; wait %2 %3; kill %1; wait' EXIT`)
	cmd := exec.Command("bash", "-c", strings.Join(script, "\n"))
	cmd.Dir = t.TempDir() // the user's working directory: the checkout's root
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var stdout, stderr testnode.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The shell and its nodes in a group of their own, which the test
	// kills whatever happens; Wait does not wait for a node left behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("the recipe still runs after 60 s\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	if err != nil {
		t.Fatalf("the recipe failed: %v\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", err, strings.Join(script, "\n"), stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 4 || strings.Count(stdout.String(), " active ") != 1 || strings.Count(stdout.String(), " standby ") != 2 {
		t.Fatalf("kunci status shows no settled cluster:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	checkIgnored(t, cmd.Dir)
}

// checkIgnored: every file a recipe wrote in dir, run there as in the
// checkout's root, is one the repository's .gitignore ignores, so that
// git add cannot pick up a node's data or the cluster key (a secret).
func checkIgnored(t *testing.T, dir string) {
	t.Helper()
	if out, err := exec.Command("git", "-C", repoRoot, "rev-parse", "--is-inside-work-tree").Output(); err != nil || strings.TrimSpace(string(out)) != "true" {
		t.Log("not in a git checkout: .gitignore not checked")
		return
	}
	var written []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if !d.IsDir() {
			written = append(written, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(written) == 0 {
		t.Fatal("the recipe wrote no file: where do its key and data go?")
	}
	cmd := exec.Command("git", "-C", repoRoot, "check-ignore", "--no-index", "--stdin")
	cmd.Stdin = strings.NewReader(strings.Join(written, "\n") + "\n")
	out, _ := cmd.Output() // exit status 1: none is ignored
	ignored := strings.Fields(string(out))
	var not []string
	for _, f := range written {
		if !slices.Contains(ignored, f) {
			not = append(not, f)
		}
	}
	if len(not) > 0 {
		t.Errorf("the cluster recipe writes files that .gitignore does not cover, in the checkout it is run from: %v", not)
	}
}

// TestREADMESaysWhatMakeTestRuns: the README's Quick start and its
// Development table say what `make test` runs: every test-* target the
// Makefile's test runs (the table names each, `make test-go` …, and the
// Quick start each language's tests), go vet, npm ci when a target runs
// it (it downloads packages), and that they run side by side when make
// runs them so.
func TestREADMESaysWhatMakeTestRuns(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	mk := string(b)
	recipe := func(target string) string {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:.*\n((?:\t.*\n)*)`).FindStringSubmatch(mk)
		if m == nil {
			t.Fatalf("the Makefile has no %s target", target)
		}
		return m[0]
	}
	test := recipe("test")
	targets := regexp.MustCompile(`\btest-[a-z]+\b`).FindAllString(test, -1)
	if len(targets) < 3 {
		t.Fatalf("make test runs %v: update this test", targets)
	}
	b, err = os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	row := regexp.MustCompile("(?m)^\\| `make test` \\|.*$").FindString(readme)
	quick := regexp.MustCompile(`(?m)^make test +#.*$`).FindString(readme)
	if row == "" || quick == "" {
		t.Fatalf("README has no `make test` row in Development (%q) or line in Quick start (%q)", row, quick)
	}
	language := map[string]string{"test-go": "Go", "test-python": "Python", "test-typescript": "TypeScript"}
	for _, target := range targets {
		if !strings.Contains(row, "`make "+target+"`") {
			t.Errorf("make test runs %s, which README's Development table does not name: %s", target, row)
		}
		lang, ok := language[target]
		if !ok {
			t.Fatalf("make test runs %s: which tests are those? Update this test", target)
		}
		if !strings.Contains(quick, lang) {
			t.Errorf("make test runs %s, the %s tests, which README's Quick start does not say: %s", target, lang, quick)
		}
		if strings.Contains(recipe(target), "npm ci") && !strings.Contains(row, "npm ci") {
			t.Errorf("make %s runs npm ci, which README's Development table does not say: %s", target, row)
		}
	}
	if strings.Contains(test, "vet") && !strings.Contains(row, "go vet") {
		t.Errorf("make test runs go vet, which README's Development table does not say: %s", row)
	}
	if regexp.MustCompile(`\$\(MAKE\).* -j`).MatchString(test) && !strings.Contains(row, "side by side") {
		t.Errorf("make test runs its targets side by side (-j), which README's Development table does not say: %s", row)
	}
}

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
