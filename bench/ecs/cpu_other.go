//go:build !linux

package main

import "time"

// threadCPU returns the CPU time the process has used: only Linux tells a
// thread's own, and the figures of this machine's reports come from Linux.
func threadCPU() time.Duration { return processCPU() }
