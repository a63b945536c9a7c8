package main

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// lineRoundTrip measures how long one cache line takes to go from CPU a
// to CPU b and back: two threads, each pinned to one of them, take turns
// writing a counter the other waits for. Every wake-up whose caller runs
// on the other core moves several such lines (the call, the channel, the
// goroutine), so this is the unit of what spreading over the cores costs.
// ok is false when the threads cannot be pinned (fewer than two CPUs, or
// an affinity mask without them).
func lineRoundTrip(a, b int, rounds int) (d time.Duration, ok bool) {
	var line struct {
		_ [64]byte
		n atomic.Int64
		_ [56]byte
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if !pin(a) {
		return 0, false
	}
	pinned := make(chan bool)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if !pin(b) {
			pinned <- false
			return
		}
		pinned <- true
		for i := int64(1); i < 2*int64(rounds); i += 2 {
			for line.n.Load() != i {
			}
			line.n.Store(i + 1)
		}
	}()
	if !<-pinned {
		return 0, false
	}
	start := time.Now()
	for i := int64(0); i < 2*int64(rounds); i += 2 {
		line.n.Store(i + 1)
		for line.n.Load() != i+2 {
		}
	}
	return time.Since(start) / time.Duration(rounds), true
}

// pin binds the calling thread to cpu.
func pin(cpu int) bool {
	if cpu < 0 || cpu >= 1024 {
		return false
	}
	var mask [1024 / 64]uint64
	mask[cpu/64] |= 1 << (cpu % 64)
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
	return errno == 0
}
