package main

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The container image and the Kubernetes manifests cannot be built or
// applied here (no container engine, no cluster): these tests check what
// can be checked without them — the Dockerfile builds from its context,
// and every setting the image and the manifests give kuncid is one of its
// settings and makes a node that starts.

// instruction is one Dockerfile instruction: its keyword, its --options
// and the rest.
type instruction struct {
	cmd  string            // FROM, COPY, RUN, ...
	opts map[string]string // --from=build → from: build
	args string
}

// dockerStage is a FROM and what follows it.
type dockerStage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile reads the repository's Dockerfile: continuation lines
// joined, comments dropped, grouped by stage. ARGs before the first FROM are
// returned apart.
func parseDockerfile(t *testing.T) (globalArgs map[string]string, stages []*dockerStage) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	globalArgs = map[string]string{}
	var lines []string
	cont := ""
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || trimmed == "" && cont == "" {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cont += strings.TrimSuffix(trimmed, `\`) + " "
			continue
		}
		lines = append(lines, cont+trimmed)
		cont = ""
	}
	for _, line := range lines {
		cmd, rest, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), opts: map[string]string{}}
		for strings.HasPrefix(rest, "--") {
			var opt string
			opt, rest, _ = strings.Cut(rest, " ")
			k, v, _ := strings.Cut(strings.TrimPrefix(opt, "--"), "=")
			in.opts[k] += v + " "
			rest = strings.TrimSpace(rest)
		}
		in.args = rest
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(rest)
			st := &dockerStage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
		case len(stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(rest, "=")
			globalArgs[k] = strings.Trim(v, `"`)
		case len(stages) == 0:
			t.Fatalf("Dockerfile: %s before the first FROM", in.cmd)
		default:
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a runtime stage", len(stages))
	}
	return globalArgs, stages
}

// dockerEnv returns the KUNCI_ settings of a stage's ENV instructions
// (the KEY=VALUE form).
func dockerEnv(t *testing.T, st *dockerStage) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, in := range st.ins {
		if in.cmd != "ENV" {
			continue
		}
		for _, kv := range strings.Fields(in.args) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("Dockerfile: ENV %q: use the KEY=VALUE form", in.args)
			}
			env[k] = strings.Trim(v, `"`)
		}
	}
	return env
}

// ignoreMatcher is a .dockerignore: patterns relative to the context,
// "**" for any directories, "!" to take a path back; the last match wins,
// and a path whose directory is excluded is excluded.
type ignoreMatcher []struct {
	re     *regexp.Regexp
	negate bool
}

func readDockerignore(t *testing.T) ignoreMatcher {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var m ignoreMatcher
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		negate := strings.HasPrefix(line, "!")
		p := strings.Trim(strings.TrimPrefix(line, "!"), "/")
		var re strings.Builder
		for i := 0; i < len(p); i++ {
			switch {
			case strings.HasPrefix(p[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(p[i:], "**"):
				re.WriteString(".*")
				i++
			case p[i] == '*':
				re.WriteString("[^/]*")
			case p[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(p[i : i+1]))
			}
		}
		m = append(m, struct {
			re     *regexp.Regexp
			negate bool
		}{regexp.MustCompile("^" + re.String() + "$"), negate})
	}
	return m
}

func (m ignoreMatcher) excluded(path string) bool {
	excluded := false
	for dir := path; ; dir = filepath.Dir(dir) {
		for _, p := range m {
			if p.re.MatchString(filepath.ToSlash(dir)) {
				excluded = !p.negate
			}
		}
		if excluded || !strings.Contains(dir, "/") {
			return excluded
		}
	}
}

// buildContext copies what docker build would send (the repository less
// .dockerignore) to a directory of its own.
func buildContext(t *testing.T) string {
	t.Helper()
	ignore := readDockerignore(t)
	dst := t.TempDir()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "." {
			return nil
		}
		if ignore.excluded(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestDockerfileBuilds plays the Dockerfile's build stage without docker:
// its context is the repository less .dockerignore, every COPY source is
// in it, and its RUN lines — the go build among them, as written, with
// /out moved into a temporary directory — build a static kuncid and kunci
// that print the version the build arguments give. Then the runtime
// stage: every file it copies from the build stage was made, it runs as a
// user other than root, its health check probes the admin endpoint its ENV
// sets with kunci health, and the build image's Go is new enough.
func TestDockerfileBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kuncid and kunci without cgo")
	}
	args, stages := parseDockerfile(t)
	build, runtime := stages[0], stages[len(stages)-1]

	// The Go of the build image is at least go.mod's.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod))
	from := strings.ReplaceAll(build.from, "${GO_VERSION}", args["GO_VERSION"])
	got := regexp.MustCompile(`^golang:(\d+)\.(\d+)`).FindStringSubmatch(from)
	if want == nil || got == nil {
		t.Fatalf("build stage FROM %q, go.mod go %v: want golang:X.Y", from, want)
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	if g, w := atoi(got[1])*1000+atoi(got[2]), atoi(want[1])*1000+atoi(want[2]); g < w {
		t.Errorf("build image %s is older than go.mod's go %s.%s", from, want[1], want[2])
	}

	ctx := buildContext(t)
	out := filepath.Join(t.TempDir(), "out")
	env := append(os.Environ(), "TAG=9.8.7-test", "COMMIT=0123456789ab")
	ran := 0
	for _, in := range build.ins {
		switch in.cmd {
		case "COPY", "ADD":
			if in.opts["from"] != "" {
				t.Fatalf("build stage: COPY --from in the build stage: %q", in.args)
			}
			f := strings.Fields(in.args)
			for _, src := range f[:len(f)-1] {
				if m, _ := filepath.Glob(filepath.Join(ctx, src)); len(m) == 0 {
					t.Errorf("Dockerfile: COPY %s: not in the build context (the repository less .dockerignore)", src)
				}
			}
		case "RUN":
			script := strings.ReplaceAll(in.args, "/out", out)
			cmd := exec.Command("sh", "-c", script)
			cmd.Dir, cmd.Env = ctx, env
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("Dockerfile: RUN %s: %v\n%s", in.args, err, b)
			}
			ran++
		}
	}
	if ran == 0 {
		t.Fatal("the build stage runs nothing")
	}
	for _, name := range []string{"kuncid", "kunci"} {
		bin := filepath.Join(out, name)
		v, err := exec.Command(bin, "--version").Output()
		if err != nil || string(v) != name+" 9.8.7-test (commit 0123456789ab)\n" {
			t.Errorf("%s --version built by the Dockerfile: %q %v", name, v, err)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked: distroless/static has no loader", name)
			}
		}
		f.Close()
	}

	// The runtime stage.
	copied := map[string]bool{}
	for _, in := range runtime.ins {
		if in.cmd != "COPY" {
			continue
		}
		if strings.TrimSpace(in.opts["from"]) != build.name {
			t.Errorf("runtime stage: COPY %s not from the build stage %q", in.args, build.name)
			continue
		}
		f := strings.Fields(in.args)
		for _, src := range f[:len(f)-1] {
			if _, err := os.Stat(strings.Replace(src, "/out", out, 1)); err != nil {
				t.Errorf("runtime stage: COPY --from=%s %s: the build stage made no such file", build.name, src)
			}
			dst := f[len(f)-1]
			if strings.HasSuffix(dst, "/") {
				dst += filepath.Base(src)
			}
			copied[dst] = true
		}
	}
	var user, health, entrypoint string
	for _, in := range runtime.ins {
		switch in.cmd {
		case "USER":
			user = in.args
		case "HEALTHCHECK":
			health = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		}
	}
	if user == "" && !strings.HasSuffix(runtime.from, ":nonroot") || user == "root" || user == "0" || strings.HasPrefix(user, "0:") {
		t.Errorf("the image runs as %q (FROM %s): want a user other than root", user, runtime.from)
	}
	if !strings.Contains(runtime.from, "distroless") && runtime.from != "scratch" {
		t.Errorf("runtime stage FROM %s: want distroless or scratch", runtime.from)
	}
	var hc []string
	if h, ok := strings.CutPrefix(health, "CMD "); !ok || !json.Valid([]byte(h)) || json.Unmarshal([]byte(h), &hc) != nil {
		t.Fatalf("HEALTHCHECK %q: want CMD [\"...\", ...] (exec form: the image has no shell)", health)
	}
	admin := dockerEnv(t, runtime)["KUNCI_ADMIN"]
	_, port, _ := net.SplitHostPort(admin)
	if len(hc) < 3 || !copied[hc[0]] || filepath.Base(hc[0]) != "kunci" || hc[1] != "health" ||
		hc[len(hc)-1] != "http://127.0.0.1:"+port+"/healthz" {
		t.Errorf("HEALTHCHECK %q: want the image's kunci health on http://127.0.0.1:%s/healthz (KUNCI_ADMIN=%s)", health, port, admin)
	}
	var ep []string
	if json.Unmarshal([]byte(entrypoint), &ep) != nil || len(ep) == 0 || !copied[ep[0]] || filepath.Base(ep[0]) != "kuncid" {
		t.Errorf("ENTRYPOINT %q: want the image's kuncid, exec form", entrypoint)
	}
}

// kube is the part of a Kubernetes object these tests read.
type kube struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		// Service
		ClusterIP                string     `yaml:"clusterIP"`
		PublishNotReadyAddresses bool       `yaml:"publishNotReadyAddresses"`
		Selector                 yaml.Node  `yaml:"selector"`
		Ports                    []kubePort `yaml:"ports"`
		MinAvailable             *int       `yaml:"minAvailable"`
		PodSelector              yaml.Node  `yaml:"podSelector"`
		Ingress                  []struct {
			Ports []struct {
				Port string `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
		// StatefulSet
		ServiceName string `yaml:"serviceName"`
		Replicas    int    `yaml:"replicas"`
		Template    struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				SecurityContext struct {
					RunAsNonRoot *bool `yaml:"runAsNonRoot"`
					RunAsUser    *int  `yaml:"runAsUser"`
					FSGroup      *int  `yaml:"fsGroup"`
					// FSGroupChangePolicy: OnRootMismatch, or the kubelet
					// makes everything on the volume group-writable at
					// every mount.
					FSGroupChangePolicy string `yaml:"fsGroupChangePolicy"`
				} `yaml:"securityContext"`
				Containers []struct {
					Env []struct {
						Name      string    `yaml:"name"`
						Value     string    `yaml:"value"`
						ValueFrom yaml.Node `yaml:"valueFrom"`
					} `yaml:"env"`
					Ports          []kubePort `yaml:"ports"`
					ReadinessProbe kubeProbe  `yaml:"readinessProbe"`
					LivenessProbe  kubeProbe  `yaml:"livenessProbe"`
					Resources      struct {
						Requests map[string]string `yaml:"requests"`
						Limits   map[string]string `yaml:"limits"`
					} `yaml:"resources"`
					SecurityContext struct {
						AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
						ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
						Capabilities             struct {
							Drop []string `yaml:"drop"`
						} `yaml:"capabilities"`
					} `yaml:"securityContext"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name   string `yaml:"name"`
					Secret *struct {
						SecretName  string `yaml:"secretName"`
						DefaultMode *int   `yaml:"defaultMode"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

type kubePort struct {
	Name          string `yaml:"name"`
	Port          int    `yaml:"port"`
	ContainerPort int    `yaml:"containerPort"`
	TargetPort    string `yaml:"targetPort"`
}

type kubeProbe struct {
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
}

// selector returns a Service's selector or a PDB's matchLabels.
func (k *kube) selector(t *testing.T) map[string]string {
	t.Helper()
	var sel struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	var plain map[string]string
	if k.Kind == "Service" {
		if err := k.Spec.Selector.Decode(&plain); err != nil {
			t.Fatalf("%s %s: selector: %v", k.Kind, k.Metadata.Name, err)
		}
		return plain
	}
	node := &k.Spec.Selector
	if k.Kind == "NetworkPolicy" {
		node = &k.Spec.PodSelector
	}
	if err := node.Decode(&sel); err != nil {
		t.Fatalf("%s %s: selector: %v", k.Kind, k.Metadata.Name, err)
	}
	return sel.MatchLabels
}

// readManifests reads every object of deploy/k8s, and checks that the
// kustomization lists every file.
func readManifests(t *testing.T) map[string]*kube {
	t.Helper()
	dir := filepath.Join(repoRoot, "deploy/k8s")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy/k8s: %v %v", files, err)
	}
	var k struct {
		Resources []string `yaml:"resources"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	objs := map[string]*kube{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		if !slices.Contains(k.Resources, filepath.Base(f)) {
			t.Errorf("deploy/k8s/kustomization.yaml does not list %s", filepath.Base(f))
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		for {
			var k kube
			if err := dec.Decode(&k); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs[k.Kind+"/"+k.Metadata.Name] = &k
		}
	}
	return objs
}

func modeString(m *int) string {
	if m == nil {
		return "unset (0644)"
	}
	return fmt.Sprintf("%#o", *m)
}

// expandKube expands $(VAR) in an env value as the kubelet does.
func expandKube(v string, vars map[string]string) string {
	return regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(v, func(m string) string {
		if x, ok := vars[m[2:len(m)-1]]; ok {
			return x
		}
		return m
	})
}

// TestContainerSettingsAreKuncidSettings reads the Dockerfile's ENV and
// the StatefulSet's env for each of its pods (the image's defaults under
// the manifest's, $(POD_NAME) expanded), and parses them as kuncid does:
// every KUNCI_ variable is a kuncid setting (kuncid refuses others), and the
// settings make a node that server.New accepts. Then the manifests agree
// with the settings and with each other: the peer list names the pods'
// stable DNS names, the readiness probe is /readyz on the admin port,
// the Services and the PodDisruptionBudget select the pods, the cluster
// key comes from a Secret mounted where KUNCI_CLUSTER_KEY_FILE points, the
// data directory is the volume claim's, and the pods run as non-root on a
// read-only root file system.
func TestContainerSettingsAreKuncidSettings(t *testing.T) {
	_, stages := parseDockerfile(t)
	image := dockerEnv(t, stages[len(stages)-1])
	objs := readManifests(t)
	sts := objs["StatefulSet/kunci"]
	if sts == nil {
		t.Fatalf("deploy/k8s has no StatefulSet kunci: %v", slices.Sorted(func(y func(string) bool) {
			for k := range objs {
				if !y(k) {
					return
				}
			}
		}))
	}
	if len(sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet kunci: %d containers, want 1", len(sts.Spec.Template.Spec.Containers))
	}
	c := sts.Spec.Template.Spec.Containers[0]
	const namespace = "locks"

	// Each pod's settings, as kuncid reads them.
	var peers []string
	for i := 0; i < sts.Spec.Replicas; i++ {
		t.Run(fmt.Sprintf("pod %d", i), func(t *testing.T) {
			env := maps.Clone(image)
			vars := map[string]string{"POD_NAME": fmt.Sprintf("%s-%d", sts.Metadata.Name, i), "POD_NAMESPACE": namespace}
			for _, e := range c.Env {
				if e.ValueFrom.Kind == 0 {
					env[e.Name] = expandKube(e.Value, vars)
				}
			}
			// The Secrets' files are mounted.
			cfg := configFromEnv(t, fmt.Sprintf("pod %d's settings", i), env)
			want := fmt.Sprintf("%s-%d.%s.%s.svc:", sts.Metadata.Name, i, sts.Spec.ServiceName, namespace)
			if !strings.HasPrefix(cfg.Advertise, want) {
				t.Errorf("pod %d advertises %q, want its stable name %s...", i, cfg.Advertise, want)
			}
			if i == 0 {
				peers = cfg.Peers
			}
			if !slices.Equal(cfg.Peers, peers) {
				t.Errorf("pod %d's peers %v differ from pod 0's %v", i, cfg.Peers, peers)
			}
			if len(cfg.Peers) != sts.Spec.Replicas || cfg.Peers[i] != cfg.Advertise {
				t.Errorf("peers %v: want the %d pods in ordinal order, pod %d's entry %s", cfg.Peers, sts.Spec.Replicas, i, cfg.Advertise)
			}
		})
	}

	// The manifests agree with the settings.
	env := map[string]string{}
	for k, v := range image {
		env[k] = v
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	portOf := func(addr string) int {
		_, p, _ := net.SplitHostPort(addr)
		n, _ := strconv.Atoi(p)
		return n
	}
	if ports["kunci"] != portOf(env["KUNCI_LISTEN"]) || len(ports) != 1 {
		t.Errorf("container ports %v, want kunci = KUNCI_LISTEN %s alone", ports, env["KUNCI_LISTEN"])
	}
	// The admin endpoint lists every token: it stays in the pod, and the
	// probes read it there.
	if host, _, _ := net.SplitHostPort(env["KUNCI_ADMIN"]); host != "127.0.0.1" {
		t.Errorf("KUNCI_ADMIN %s: want the admin endpoint on 127.0.0.1, in the pod", env["KUNCI_ADMIN"])
	}
	probe := func(p kubeProbe, path string) bool {
		want := "http://" + env["KUNCI_ADMIN"] + path
		return p.Exec != nil && len(p.Exec.Command) > 2 && p.Exec.Command[0] == "/usr/local/bin/kunci" &&
			p.Exec.Command[1] == "health" && p.Exec.Command[len(p.Exec.Command)-1] == want
	}
	if !probe(c.ReadinessProbe, "/readyz") {
		t.Errorf("readiness probe %+v: want kunci health of /readyz on KUNCI_ADMIN (ready = the active)", c.ReadinessProbe.Exec)
	}
	if !probe(c.LivenessProbe, "/healthz") {
		t.Errorf("liveness probe %+v: want kunci health of /healthz on KUNCI_ADMIN", c.LivenessProbe.Exec)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
	}
	psc, sc := sts.Spec.Template.Spec.SecurityContext, c.SecurityContext
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("security contexts pod %+v container %+v: want non-root, a read-only root, no privilege escalation, no capabilities", psc, sc)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	secretVols := map[string]string{} // Secret volume → mount path
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		secretVols[v.Name] = mounts[v.Name]
		// kuncid refuses a key file that others may read or its group write.
		if m := v.Secret.DefaultMode; m == nil || *m&0o027 != 0 {
			t.Errorf("Secret volume %s: defaultMode %s, want one kuncid accepts (no group write, nothing for others: 0400, 0440)", v.Name, modeString(m))
		}
		if psc.FSGroup == nil {
			t.Errorf("Secret volume %s without fsGroup: the non-root user could not read the key", v.Name)
		}
	}
	inSecret := func(file string) bool {
		for _, m := range secretVols {
			if m != "" && filepath.Dir(file) == m {
				return true
			}
		}
		return false
	}
	// The cluster key, and the clients' credentials: any pod that reaches
	// the port could otherwise release any lock.
	for _, v := range []string{"KUNCI_CLUSTER_KEY_FILE", "KUNCI_AUTH_FILE"} {
		if !inSecret(env[v]) {
			t.Errorf("%s %q is not in a Secret volume (mounted: %v)", v, env[v], secretVols)
		}
	}
	// With fsGroup the kubelet makes the volume's root group-writable, and
	// kuncid refuses a data directory its group may write: the data
	// directory is one kuncid creates (0700) inside the volume, and the
	// kubelet must leave it so at later mounts (OnRootMismatch; Always
	// makes everything on the volume group-writable at every mount).
	claims := sts.Spec.VolumeClaimTemplates
	if len(claims) != 1 || filepath.Dir(env["KUNCI_DATA_DIR"]) != mounts[claims[0].Metadata.Name] {
		t.Errorf("KUNCI_DATA_DIR %q is not a directory in the volume claim's mount %v", env["KUNCI_DATA_DIR"], mounts)
	}
	if psc.FSGroup != nil && psc.FSGroupChangePolicy != "OnRootMismatch" {
		t.Errorf("fsGroupChangePolicy %q with fsGroup: the kubelet would make the data directory group-writable at every mount, and kuncid refuses it; want OnRootMismatch", psc.FSGroupChangePolicy)
	}

	// Services and the budget select the pods.
	labels := sts.Spec.Template.Metadata.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	headless := objs["Service/"+sts.Spec.ServiceName]
	if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses || !selects(headless.selector(t)) {
		t.Errorf("Service %s (the StatefulSet's serviceName): want headless, publishing pods not ready (standbys never are), selecting the pods", sts.Spec.ServiceName)
	}
	var client *kube
	for _, o := range objs {
		if o.Kind == "Service" && o != headless {
			client = o
		}
	}
	if client == nil || client.Spec.ClusterIP == "None" || client.Spec.PublishNotReadyAddresses || !selects(client.selector(t)) ||
		len(client.Spec.Ports) != 1 || client.Spec.Ports[0].TargetPort != "kunci" {
		t.Errorf("want a client Service of the ready pods (the active) on the kunci port")
	}
	var pdb *kube
	for _, o := range objs {
		if o.Kind == "PodDisruptionBudget" {
			pdb = o
		}
	}
	if pdb == nil || !selects(pdb.selector(t)) {
		t.Errorf("want a PodDisruptionBudget selecting the pods")
	}
	// Only the kunci port is reachable, and only from chosen pods.
	np := objs["NetworkPolicy/kunci"]
	if np == nil || !selects(np.selector(t)) || len(np.Spec.Ingress) == 0 {
		t.Fatalf("want a NetworkPolicy selecting the pods, with ingress rules")
	}
	for _, in := range np.Spec.Ingress {
		if len(in.Ports) != 1 || in.Ports[0].Port != "kunci" {
			t.Errorf("NetworkPolicy ingress %+v: want the kunci port alone", in)
		}
	}
}
