package main

import (
	"runtime"
	"syscall"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
)

// Other work on the machine slows the hits down: a child records how busy the
// cores were with work not its own while it timed them, and the parent waits
// for quiet cores before each child.

// cpuSample is the machine's busy CPU time and this process's own.
type cpuSample struct {
	busy, own time.Duration
	ok        bool
}

// readCPU samples /proc/stat and the process's resource usage. Time the
// hypervisor took counts as busy: it is not this process's either.
func readCPU() cpuSample {
	var s cpuSample
	all, ok := harness.CPULoads()["cpu"]
	if !ok {
		return s
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return s
	}
	s.busy = all.Busy + all.Steal
	s.own = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	s.ok = true
	return s
}

// since returns the CPU time spent between prev and s.
func (s cpuSample) since(prev cpuSample) cpuSample {
	return cpuSample{busy: s.busy - prev.busy, own: s.own - prev.own, ok: s.ok && prev.ok}
}

// plus returns the CPU time of two spans together.
func (s cpuSample) plus(d cpuSample) cpuSample {
	return cpuSample{busy: s.busy + d.busy, own: s.own + d.own, ok: s.ok && d.ok}
}

// othersShare returns the share of the cores that other processes' work
// kept busy during s, a span of wall time, or -1 if unknown.
func (s cpuSample) othersShare(wall time.Duration) float64 {
	if !s.ok || wall <= 0 {
		return -1
	}
	others := float64(s.busy-s.own) / float64(wall) / float64(runtime.NumCPU())
	return min(1, max(0, others))
}

// quietShare is the share of the cores other work may take for the machine
// to count as quiet: a quarter, half a core of two.
const quietShare = 0.25

// waitQuiet waits, up to limit, for a second in which other processes keep
// less than quietShare of the cores busy. It returns the time waited and
// the share in the last second.
func waitQuiet(limit time.Duration) (time.Duration, float64) {
	start := time.Now()
	for {
		a, t := readCPU(), time.Now()
		time.Sleep(time.Second)
		others := readCPU().since(a).othersShare(time.Since(t))
		if others < quietShare || time.Since(start) >= limit {
			return time.Since(start), others
		}
	}
}
