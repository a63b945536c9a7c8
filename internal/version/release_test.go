package version

import (
	"os"
	"regexp"
	"testing"
)

// A release is cut whole: the Release constant, the CHANGELOG's newest
// released section, the image the Kubernetes manifests run, and the
// Python and TypeScript clients' packages name the same version (git tag
// vRELEASE marks it).
func TestReleaseIsTheSameEverywhere(t *testing.T) {
	log, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindSubmatch(log)
	if m == nil || string(m[1]) != Release {
		t.Errorf("CHANGELOG.md's newest release is %q, the Release constant %s", m, Release)
	}
	k, err := os.ReadFile("../../deploy/k8s/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`newTag: (\S+)`).FindSubmatch(k); m == nil || string(m[1]) != Release {
		t.Errorf("deploy/k8s/kustomization.yaml runs image tag %q, the Release constant %s", m, Release)
	}
	for _, f := range []struct{ path, pattern string }{
		{"../../clients/python/pyproject.toml", `(?m)^version = "([^"]+)"$`},
		{"../../clients/python/kunci/__init__.py", `(?m)^__version__ = "([^"]+)"$`},
		{"../../clients/typescript/package.json", `(?m)^  "version": "([^"]+)",$`},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		if m := regexp.MustCompile(f.pattern).FindSubmatch(b); m == nil || string(m[1]) != Release {
			t.Errorf("%s says version %q, the Release constant %s", f.path, m, Release)
		}
	}
}
