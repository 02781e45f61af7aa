package harness

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// This file builds on every system, so that a tool that only samples the
// machine's load need not be Linux-only; where there is no /proc/stat,
// CPULoads finds nothing.

// ClockTicks is the unit of the CPU times in /proc/PID/stat and /proc/stat.
var ClockTicks = func() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}()

// CPULoad is the time a CPU, or all of them together, spent busy, and the
// time the hypervisor took from it.
type CPULoad struct {
	Busy  time.Duration // user, nice, system, irq, softirq
	Steal time.Duration // taken by the hypervisor
}

// Sub returns the time spent between b and a.
func (a CPULoad) Sub(b CPULoad) CPULoad {
	return CPULoad{Busy: a.Busy - b.Busy, Steal: a.Steal - b.Steal}
}

// CPULoads reads /proc/stat: the CPUs together under "cpu", each one under
// "cpuN". It is empty where /proc/stat cannot be read.
func CPULoads() map[string]CPULoad {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	return ParseCPULoads(string(b), ClockTicks)
}

// ParseCPULoads reads the cpu lines of /proc/stat text, whose times are in
// ticks (more than 0) per second. A line it cannot read is left out.
func ParseCPULoads(stat string, ticks int64) map[string]CPULoad {
	loads := map[string]CPULoad{}
	for line := range strings.Lines(stat) {
		f := strings.Fields(line)
		// user nice system idle iowait irq softirq steal [guest guest_nice]
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		var v [8]int64
		ok := true
		for i := range v {
			var err error
			if v[i], err = strconv.ParseInt(f[1+i], 10, 64); err != nil {
				ok = false
			}
		}
		if !ok {
			continue
		}
		loads[f[0]] = CPULoad{Busy: ticksToDuration(v[0]+v[1]+v[2]+v[5]+v[6], ticks), Steal: ticksToDuration(v[7], ticks)}
	}
	return loads
}

// ticksToDuration converts n ticks of ticks per second, in whole seconds
// first: the summed line of /proc/stat on a many-core machine up for months,
// or a busy process's times, count more ticks than n*time.Second can hold.
func ticksToDuration(n, ticks int64) time.Duration {
	return time.Duration(n/ticks)*time.Second + time.Duration(n%ticks)*time.Second/time.Duration(ticks)
}

// CoreLoads reads the given CPUs' times from /proc/stat, in their order; a
// CPU it does not list counts nothing.
func CoreLoads(cpus []int) []CPULoad {
	all := CPULoads()
	out := make([]CPULoad, len(cpus))
	for k, c := range cpus {
		out[k] = all["cpu"+strconv.Itoa(c)]
	}
	return out
}
