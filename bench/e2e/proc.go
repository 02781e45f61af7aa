//go:build linux

package main

import (
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
)

// niceness is the scheduling priority the servers and dnsperf run at
// (nice(1)); 0 leaves it alone.
var niceness = 0

// rtPriority is the SCHED_RR priority of the server and dnsperf during the
// fixed-rate phases of -rt-rates.
const rtPriority = 10

// launch is how the run starts a server on core: at the run's niceness, in
// its directory, with serverEnv(env).
func (r *runner) launch(core int, env []string) harness.Launch {
	return harness.Launch{CPU: core, Nice: niceness, Env: serverEnv(env), Dir: r.dir}
}

// gcTrace is what the gctrace lines of a stretch of a server's log say.
type gcTrace struct {
	Cycles int
	CPU    time.Duration // the cycles' CPU time: assist, background and idle marking, and the pauses
}

// readGCs reads the gctrace lines ("gc N @...") written to a log from
// offset from on, and returns the offset of its end.
func readGCs(path string, from int64) (gcTrace, int64) {
	var t gcTrace
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < from {
		return t, from
	}
	for _, line := range strings.Split(string(b[from:]), "\n") {
		if cpu, ok := parseGCLine(line); ok {
			t.Cycles++
			t.CPU += cpu
		}
	}
	return t, int64(len(b))
}

// parseGCLine reads the CPU time of one gctrace line:
//
//	gc 7 @2.107s 1%: 0.011+1.2+0.003 ms clock, 0.011+0.15/0.90/0.21+0.003 ms cpu, 4->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 1 P
func parseGCLine(line string) (time.Duration, bool) {
	if !strings.HasPrefix(line, "gc ") || !strings.Contains(line, " @") {
		return 0, false
	}
	for _, field := range strings.Split(line, ", ") {
		v, ok := strings.CutSuffix(field, " ms cpu")
		if !ok {
			continue
		}
		total := 0.0
		for _, part := range strings.FieldsFunc(v, func(r rune) bool { return r == '+' || r == '/' }) {
			ms, err := strconv.ParseFloat(part, 64)
			if err != nil {
				return 0, true
			}
			total += ms
		}
		return time.Duration(total * float64(time.Millisecond)), true
	}
	return 0, true
}
