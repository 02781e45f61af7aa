package main

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling thread has used (Linux's
// RUSAGE_THREAD, microseconds: a round takes tens of milliseconds).
func threadCPU() time.Duration { return rusage(syscall.RUSAGE_THREAD) }
