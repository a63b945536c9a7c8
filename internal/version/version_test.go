package version

import (
	"regexp"
	"testing"
)

// semver is a semantic version (semver.org), as kunci prints it: no v.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

func TestReleaseIsASemanticVersion(t *testing.T) {
	if !semver.MatchString(Release) {
		t.Fatalf("Release %q is not a semantic version", Release)
	}
	if v := Version(); !semver.MatchString(v) {
		t.Fatalf("Version() %q is not a semantic version", v)
	}
}

func TestBuildOverrides(t *testing.T) {
	defer func(t0, c0 string) { tag, commit = t0, c0 }(tag, commit)
	tag, commit = "", ""
	if got := Version(); got != Release {
		t.Errorf("a test binary's version %q, want Release %q", got, Release)
	}
	tag, commit = "1.2.3-4-gabc1234-dirty", "abc1234-dirty"
	if got := String(); got != "1.2.3-4-gabc1234-dirty (commit abc1234-dirty)" {
		t.Errorf("String() = %q", got)
	}
	if !semver.MatchString(Version()) {
		t.Errorf("git describe's form %q is not a semantic version", Version())
	}
}
