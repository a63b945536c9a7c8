// Package version is kunci's version, in one place: the Release constant,
// which a build may override from git (make build, when the tree has a
// release tag) and `go install module@version` records by itself.
//
// Everything here is read-only after the build; safe from any goroutine.
package version

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// Release is the semantic version of this source tree: the release it is,
// or was last. Raise it, and add its section to CHANGELOG.md, when tagging
// a release (git tag v0.9.0).
const Release = "0.10.0"

// Set by the build with -ldflags '-X ...'; see the Makefile.
var (
	// tag is `git describe --tags` of a tree with a release tag, without its
	// v: 0.9.0 on the tag, 0.9.0-3-gabc1234 three commits after it, with
	// -dirty for local changes. Empty: no tag.
	tag string
	// commit is the commit built, short, -dirty for local changes.
	commit string
)

// pseudo matches a Go pseudo-version (v0.0.0-20261203071553-abcdef123456),
// which names a commit, not a release.
var pseudo = regexp.MustCompile(`\d{14}-[0-9a-f]{12}`)

// Version returns the version: the build's git tag, else the module version
// `go install ...@v0.9.0` recorded, else Release. It has no leading v.
func Version() string {
	if tag != "" {
		return tag
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" && !pseudo.MatchString(v) {
			return strings.TrimPrefix(v, "v")
		}
	}
	return Release
}

// Commit returns the commit the binary was built from: the build's, else
// the one Go recorded from version control (vcs.revision), else "".
func Commit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}

// String returns the version and, when known, the commit:
// "0.9.0 (commit abc1234)".
func String() string {
	if c := Commit(); c != "" {
		return Version() + " (commit " + c + ")"
	}
	return Version()
}
