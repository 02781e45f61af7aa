//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// proc is a server the run started: pinned to a core by taskset, which
// execs it, so that the pid is the server's own.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stderr string // path of its stderr (and stdout)
	done   chan struct{}
	err    error
}

// niceness is the scheduling priority the servers and dnsperf run at
// (nice(1)); 0 leaves it alone.
var niceness = 0

// pinned returns the command line that runs name on core, at niceness:
// nice and taskset exec what they run, so the pid is name's.
func pinned(core int, name string, args ...string) []string {
	argv := []string{"taskset", "-c", strconv.Itoa(core), name}
	if niceness != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(niceness)}, argv...)
	}
	return append(argv, args...)
}

// startPinned starts name with args on core, with env, its output in logPath.
func startPinned(core int, env []string, logPath, dir, name string, args ...string) (*proc, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	argv := pinned(core, name, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout = out
	cmd.Stderr = out
	// The servers go with the run, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, stderr: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the server with SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// clockTicks is the unit of utime and stime in /proc/PID/stat.
var clockTicks = func() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}()

// cpuTime returns the user plus system CPU time pid has used, all its
// threads, live and exited, together.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b, clockTicks)
}

// parseStatCPU reads utime and stime (fields 14 and 15) from a /proc/PID/stat
// line. The command name, field 2, is in parentheses and may hold spaces.
func parseStatCPU(b []byte, ticks int64) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field k is f[k-3].
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name", len(f))
	}
	utime, err1 := strconv.ParseInt(f[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(f[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration((utime + stime) * int64(time.Second) / ticks), nil
}

// rss returns pid's resident set size in bytes (VmRSS).
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseStatusKB(b, "VmRSS")
}

func parseStatusKB(b []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: %s: %q", field, rest)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return n << 10, nil
	}
	return 0, fmt.Errorf("status: no %s", field)
}

// waitDNS asks addr for name until it answers, p exits or the time is up.
func waitDNS(ctx context.Context, p *proc, addr, name string, qtype uint16, limit time.Duration) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: 300 * time.Millisecond}
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(4096, false)
	deadline := time.Now().Add(limit)
	for {
		r, _, err := c.ExchangeContext(ctx, m, addr)
		if err == nil {
			return r, nil
		}
		if p != nil && p.exited() {
			return nil, fmt.Errorf("%s exited: %v (see %s)", p.name, p.err, p.stderr)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no answer from %s within %v: %v", addr, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// portsFree checks that the run's ports are free on the loopback.
func portsFree(p ports) error {
	for port := p.server; port < p.reserveEnd; port++ {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("port %d is taken (choose another -port): %v", port, err)
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("udp port %d is taken (choose another -port): %v", port, err)
		}
		u.Close()
	}
	return nil
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

// coreLoad is a CPU's time from /proc/stat.
type coreLoad struct {
	Busy  time.Duration // user, nice, system, irq, softirq
	Steal time.Duration // taken by the hypervisor
}

func (a coreLoad) sub(b coreLoad) coreLoad {
	return coreLoad{Busy: a.Busy - b.Busy, Steal: a.Steal - b.Steal}
}

// coreLoads reads the given CPUs' times from /proc/stat.
func coreLoads(cpus []int) []coreLoad {
	out := make([]coreLoad, len(cpus))
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		id, err := strconv.Atoi(f[0][3:])
		if err != nil {
			continue
		}
		for k, c := range cpus {
			if c == id {
				out[k] = parseCPULine(f[1:])
			}
		}
	}
	return out
}

// parseCPULine reads user nice system idle iowait irq softirq steal.
func parseCPULine(f []string) coreLoad {
	v := make([]int64, 8)
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i], 10, 64)
	}
	tick := func(n int64) time.Duration { return time.Duration(n * int64(time.Second) / clockTicks) }
	return coreLoad{Busy: tick(v[0] + v[1] + v[2] + v[5] + v[6]), Steal: tick(v[7])}
}
