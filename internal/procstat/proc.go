// Package procstat reads what Linux's /proc says of a process: its resident
// memory, its state and its CPU times. It is for the benchmarks and the
// tests that watch a kuncid process (or their own); the node does not use
// it. Elsewhere than on Linux every function returns an error.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// RSS returns the resident memory of process pid in bytes: VmRSS of
// /proc/PID/status.
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kib, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmRSS %q", pid, rest)
			}
			return kib << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// stat returns the fields of /proc/PID/stat that follow the command name
// (field 2, in parentheses, which may hold spaces and parentheses): f[0]
// is field 3 of proc(5), the state.
func stat(pid int) ([][]byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return nil, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return f, nil
}

// State returns the state of process pid, as proc(5) letters it: 'R'
// running, 'S' sleeping, 'T' stopped (SIGSTOP), 'Z' a zombie (exited, not
// yet waited for), and others.
func State(pid int) (byte, error) {
	f, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return f[0][0], nil
}

// CPU returns the user and system CPU time process pid has used, from
// /proc/PID/stat (clock ticks taken as 100 a second, as on every Linux
// kunci runs on).
func CPU(pid int) (user, sys time.Duration, err error) {
	f, err := stat(pid)
	if err != nil {
		return 0, 0, err
	}
	// utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: bad times", pid)
	}
	const tick = 10 * time.Millisecond
	return time.Duration(ut) * tick, time.Duration(st) * tick, nil
}
