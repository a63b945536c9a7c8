package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// dataDir is the node's directory for what must outlive the process: the
// token ceiling. It is locked, so two nodes never share one.
type dataDir struct {
	path string
	lock *os.File

	mu  sync.Mutex // the reserver, promotion and replicated ceilings write
	cur uint64     // the ceiling on disk
}

// ErrDataDirInUse means another process holds the data directory's lock.
var ErrDataDirInUse = errors.New("server: data directory in use by another kuncid")

const ceilingFile = "token-ceiling"

func openDataDir(path string) (*dataDir, error) {
	if err := os.MkdirAll(path, 0o750); err != nil {
		return nil, fmt.Errorf("server: data directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(path, "LOCK"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("server: data directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(f.Name())
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (lock held by pid %s)", ErrDataDirInUse, path, strings.TrimSpace(string(owner)))
		}
		return nil, fmt.Errorf("server: locking data directory %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &dataDir{path: path, lock: f}, nil
}

// ceiling returns the persisted token ceiling, 0 when there is none yet.
func (d *dataDir) ceiling() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(d.path, ceilingFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("server: reading token ceiling: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("server: token ceiling file %s is damaged: %q", filepath.Join(d.path, ceilingFile), b)
	}
	d.mu.Lock()
	d.cur = max(d.cur, v)
	d.mu.Unlock()
	return v, nil
}

// setCeiling makes c the persisted ceiling: written to a new file, synced,
// renamed over the old one, and the directory synced. A ceiling never goes
// down: a lower c than the one on disk changes nothing.
func (d *dataDir) setCeiling(c uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c <= d.cur {
		return nil
	}
	tmp := filepath.Join(d.path, ceilingFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("server: writing token ceiling: %w", err)
	}
	_, err = f.WriteString(strconv.FormatUint(c, 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(d.path, ceilingFile))
	}
	if err == nil {
		var dir *os.File
		if dir, err = os.Open(d.path); err == nil {
			err = dir.Sync()
			dir.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("server: writing token ceiling: %w", err)
	}
	d.cur = c
	return nil
}

func (d *dataDir) close() {
	if d != nil && d.lock != nil {
		_ = d.lock.Close() // releases the flock
	}
}
