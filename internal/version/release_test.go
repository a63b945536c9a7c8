package version

import (
	"os"
	"regexp"
	"testing"
)

// A release is cut whole: the Release constant, the CHANGELOG's newest
// released section, and the image the Kubernetes manifests run name the
// same version (git tag vRELEASE marks it).
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
}
