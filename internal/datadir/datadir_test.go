package datadir_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kunci/kunci/internal/datadir"
)

// open opens dir, failing t on an error, and closes it when the test ends.
func open(t *testing.T, dir string, report func(error)) *datadir.Dir {
	t.Helper()
	d, err := datadir.Open(dir, report)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// A new directory is made private, holds no ceiling yet, keeps the
// highest ceiling written across opens, and reports every write.
func TestCeilingOnlyRises(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	var reports []error
	d := open(t, dir, func(err error) { reports = append(reports, err) })
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the directory: %v %v, want mode 0700", fi.Mode(), err)
	}
	if c, err := d.Ceiling(); c != 0 || err != nil {
		t.Fatalf("a new directory's ceiling: %d %v", c, err)
	}
	for _, c := range []uint64{1 << 20, 3 << 20, 2 << 20} {
		if err := d.SetCeiling(c); err != nil {
			t.Fatal(err)
		}
	}
	if len(reports) != 2 || reports[0] != nil || reports[1] != nil {
		t.Errorf("reports %v: want two writes that worked (a lower ceiling writes nothing)", reports)
	}
	d.Close()
	d = open(t, dir, nil)
	if c, err := d.Ceiling(); c != 3<<20 || err != nil {
		t.Fatalf("the ceiling after a reopen: %d %v, want %d", c, err, 3<<20)
	}
	if fi, err := os.Stat(filepath.Join(dir, datadir.CeilingFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the ceiling file: %v %v, want mode 0600", fi.Mode(), err)
	}
}

// A second opener of a locked directory is refused.
func TestLockedDirectoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, nil)
	if _, err := datadir.Open(dir, nil); !errors.Is(err, datadir.ErrInUse) {
		t.Fatalf("a second Open: %v, want ErrInUse", err)
	}
}

// A directory others may write, a symbolic link in its place, a damaged or
// linked ceiling file: each is refused and says why.
func TestUnsafeDirectoriesAreRefused(t *testing.T) {
	t.Run("writable by others", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if _, err := datadir.Open(dir, nil); err == nil || !strings.Contains(err.Error(), "chmod go-w") {
			t.Fatalf("Open of a 0777 directory: %v", err)
		}
	})
	t.Run("a symbolic link", func(t *testing.T) {
		real := t.TempDir()
		link := filepath.Join(t.TempDir(), "data")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if _, err := datadir.Open(link, nil); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("Open of a link: %v", err)
		}
	})
	t.Run("a damaged ceiling", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, datadir.CeilingFile), []byte("twelve\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := open(t, dir, nil).Ceiling(); err == nil || !strings.Contains(err.Error(), "damaged") {
			t.Fatalf("Ceiling of a damaged file: %v", err)
		}
	})
	t.Run("a linked ceiling", func(t *testing.T) {
		dir := t.TempDir()
		other := filepath.Join(t.TempDir(), "elsewhere")
		if err := os.WriteFile(other, []byte("5\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(other, filepath.Join(dir, datadir.CeilingFile)); err != nil {
			t.Fatal(err)
		}
		if _, err := open(t, dir, nil).Ceiling(); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("Ceiling through a link: %v", err)
		}
	})
}
