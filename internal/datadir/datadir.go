// Package datadir is a kunci node's data directory: what must outlive the
// process, the token ceiling, in a directory locked to one node and private
// to kuncid's user. The server package uses it; it reports every write of
// the ceiling to a callback, for the node's storage health.
package datadir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kunci/kunci/engine"
)

// Dir is the node's directory for what must outlive the process: the
// token ceiling. It is locked, so two nodes never share one. It must be
// private to kuncid's user: kuncid creates it 0700 and its files 0600,
// refuses a directory that others may write, and refuses to write through
// a link someone put in its place. The directory itself is opened once, by
// a handle that did not follow a symbolic link, and every file in it is
// opened relative to that handle: a directory swapped for a link after
// the start is never written through either.
type Dir struct {
	path   string
	dir    *os.File // the directory, opened with O_NOFOLLOW
	lock   *os.File
	report func(error) // told of every attempt to persist the ceiling; may be nil

	mu  sync.Mutex // the ceiling writer and a standby's replicated ceilings write
	cur uint64     // the ceiling on disk
}

// ErrInUse means another process holds the data directory's lock.
var ErrInUse = errors.New("data directory in use by another kuncid")

// CeilingFile is the token ceiling's file in the directory.
const CeilingFile = "token-ceiling"

// Open creates the directory path if need be (0700), checks that it is
// private to this user and no symbolic link, and locks it. report, when
// not nil, is told how every write of the ceiling went (nil: it worked).
func Open(path string, report func(error)) (*Dir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	// The last element of the path is what someone who may write its
	// parent could swap for a link; links higher up (/var on some
	// systems) are the administrator's, and followed.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			return nil, fmt.Errorf("data directory %s is a symbolic link (to %s): refused, since whoever can change the link can point kuncid's token ceiling elsewhere; give the directory's real path (--data-dir %s)",
				path, target, resolved(path))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", path, err)
	}
	dir := os.NewFile(uintptr(fd), path)
	fi, err := dir.Stat()
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("data directory: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		dir.Close()
		who := "group and others"
		switch perm & 0o022 {
		case 0o020:
			who = "its group"
		case 0o002:
			who = "others"
		}
		return nil, fmt.Errorf("data directory %s is writable by %s (mode %04o): whoever can write there can replace the token ceiling, so kuncid refuses it; make it private with: chmod go-w %s",
			path, who, perm, path)
	}
	d := &Dir{path: path, dir: dir, report: report}
	f, err := d.openPrivate("LOCK", os.O_RDWR)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("data directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner, _ := io.ReadAll(f)
		f.Close()
		dir.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (lock held by pid %s)", ErrInUse, path, strings.TrimSpace(string(owner)))
		}
		return nil, fmt.Errorf("locking data directory %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	d.lock = f
	return d, nil
}

// resolved returns path with its links resolved, or path when that fails.
func resolved(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return path
}

// openPrivate opens the file name of the data directory (flag: O_RDWR or
// O_WRONLY), creating it 0600, and makes sure it is a plain file of kuncid's
// own: it refuses a symbolic link (O_NOFOLLOW), a file with other links
// (someone linked a file there to have kuncid overwrite it), and anything
// but a regular file (O_NONBLOCK: opening a FIFO does not wait). It does not
// truncate: the caller does once the file is known to be safe.
func (d *Dir) openPrivate(name string, flag int) (*os.File, error) {
	path := filepath.Join(d.path, name)
	fd, err := unix.Openat(int(d.dir.Fd()), name, flag|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link: refused (kuncid would write to the file it points to); remove the link", path)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err == nil {
		st, _ := fi.Sys().(*syscall.Stat_t)
		switch {
		case !fi.Mode().IsRegular():
			err = fmt.Errorf("%s is not a regular file (%v): refused; remove it", path, fi.Mode().Type())
		case st != nil && st.Nlink != 1:
			err = fmt.Errorf("%s has %d hard links: refused (kuncid would write to a file that is also elsewhere); remove it", path, st.Nlink)
		case fi.Mode().Perm() != 0o600:
			err = f.Chmod(0o600)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Ceiling returns the persisted token ceiling, 0 when there is none yet.
func (d *Dir) Ceiling() (uint64, error) {
	var b []byte
	fd, err := unix.Openat(int(d.dir.Fd()), CeilingFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return 0, nil
	case errors.Is(err, unix.ELOOP):
		return 0, fmt.Errorf("token ceiling %s is a symbolic link: refused (a ceiling is kuncid's own file); remove the link, and put the ceiling file itself there if it is the right one", filepath.Join(d.path, CeilingFile))
	case err == nil:
		f := os.NewFile(uintptr(fd), filepath.Join(d.path, CeilingFile))
		b, err = io.ReadAll(io.LimitReader(f, 64))
		f.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("reading token ceiling: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("token ceiling file %s is damaged: %q", filepath.Join(d.path, CeilingFile), b)
	}
	if v > engine.MaxToken {
		return 0, fmt.Errorf("token ceiling %d in %s is above 2^63-1 (%d), the largest token kuncid issues (tokens fit a signed 64-bit integer): the file is damaged",
			v, filepath.Join(d.path, CeilingFile), uint64(engine.MaxToken))
	}
	d.mu.Lock()
	d.cur = max(d.cur, v)
	d.mu.Unlock()
	return v, nil
}

// SetCeiling makes c the persisted ceiling: written to a new file, synced,
// renamed over the old one, and the directory synced. A ceiling never goes
// down: a lower c than the one on disk changes nothing. Each write, failed
// or not, is reported.
func (d *Dir) SetCeiling(c uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c <= d.cur {
		return nil
	}
	err := d.writeCeiling(c)
	if d.report != nil {
		d.report(err)
	}
	if err != nil {
		return err
	}
	d.cur = c
	return nil
}

func (d *Dir) writeCeiling(c uint64) error {
	if c > engine.MaxToken {
		return fmt.Errorf("token ceiling %d is above 2^63-1, the largest token: not written", c)
	}
	f, err := d.openPrivate(CeilingFile+".tmp", os.O_WRONLY)
	if err != nil {
		return fmt.Errorf("writing token ceiling: %w", err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteString(strconv.FormatUint(c, 10) + "\n")
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		dfd := int(d.dir.Fd())
		if err = unix.Renameat(dfd, CeilingFile+".tmp", dfd, CeilingFile); err == nil {
			err = d.dir.Sync()
		}
	}
	if err != nil {
		return fmt.Errorf("writing token ceiling: %w", err)
	}
	return nil
}

// Path returns the directory's path, as given to Open.
func (d *Dir) Path() string { return d.path }

// Close unlocks the directory.
func (d *Dir) Close() {
	if d != nil && d.lock != nil {
		_ = d.lock.Close() // releases the flock
		_ = d.dir.Close()
	}
}
