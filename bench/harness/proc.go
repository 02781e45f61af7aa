//go:build linux

package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// Proc is a process a tool started, its output in a log file.
type Proc struct {
	Name string
	Log  string // path of its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Pinned returns the command line that runs name with args on cpu (taskset;
// -1: not pinned) at niceness nice (nice -n; 0: the tool's own). nice and
// taskset exec what they run, so that the pid is name's own.
func Pinned(cpu, nice int, name string, args ...string) []string {
	argv := append([]string{name}, args...)
	if cpu >= 0 {
		argv = append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
	}
	if nice != 0 {
		argv = append([]string{"nice", "-n", strconv.Itoa(nice)}, argv...)
	}
	return argv
}

// Start starts cmd with its output in logPath. The process is killed when
// the tool exits, however that happens.
func Start(name, logPath string, cmd *exec.Cmd) (*Proc, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended; nil while it runs.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Stop ends the process with SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
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

// Launch is how a run starts its processes: pinned to CPU (taskset; -1:
// not pinned), at niceness Nice (nice -n; 0: the tool's own), with Env
// (nil: the tool's environment), in Dir (empty: the tool's).
type Launch struct {
	CPU, Nice int
	Env       []string
	Dir       string
}

// Start starts name with args as l says, its output in logPath.
func (l Launch) Start(logPath, name string, args ...string) (*Proc, error) {
	argv := Pinned(l.CPU, l.Nice, name, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = l.Env, l.Dir
	return Start(filepath.Base(name), logPath, cmd)
}

// CoreDNS writes corefile to base.Corefile and starts the build bin on it
// as l says, with args after -conf, its output in base.log; the process is
// named after base's last element.
func (l Launch) CoreDNS(bin, base, corefile string, args ...string) (*Proc, error) {
	if err := os.WriteFile(base+".Corefile", []byte(corefile), 0o644); err != nil {
		return nil, err
	}
	p, err := l.Start(base+".log", bin, append([]string{"-conf", base + ".Corefile"}, args...)...)
	if p != nil {
		p.Name = filepath.Base(base)
	}
	return p, err
}

// WaitDNS asks addr for q, with EDNS, every poll until it answers, p exits
// or limit passes; p may be nil.
func WaitDNS(ctx context.Context, p *Proc, addr string, q dns.Question, limit, poll time.Duration) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp", Timeout: 300 * time.Millisecond}
	m := new(dns.Msg)
	m.Question = []dns.Question{q}
	m.RecursionDesired = true
	m.SetEdns0(4096, false)
	deadline := time.Now().Add(limit)
	for {
		r, _, err := c.ExchangeContext(ctx, m, addr)
		if err == nil {
			return r, nil
		}
		if p != nil && p.Exited() {
			return nil, fmt.Errorf("%s exited: %v (see %s)", p.Name, p.err, p.Log)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no answer from %s within %v: %v", addr, limit, err)
		}
		time.Sleep(poll)
	}
}

// CPUTime returns the user plus system CPU time pid has used, all its
// threads, live and exited, together.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseStatCPU(b, ClockTicks)
}

// ParseStatCPU reads utime and stime (fields 14 and 15) from a /proc/PID/stat
// line. The command name, field 2, is in parentheses and may hold spaces.
func ParseStatCPU(b []byte, ticks int64) (time.Duration, error) {
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
	return ticksToDuration(utime+stime, ticks), nil
}

// RSS returns pid's resident set size in bytes (VmRSS).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return ParseStatusKB(b, "VmRSS")
}

// ParseStatusKB reads a "Name: N kB" field of /proc/PID/status or
// /proc/meminfo, in bytes.
func ParseStatusKB(b []byte, field string) (int64, error) {
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

// RunTime returns the time pid's live threads have spent on a CPU, to the
// nanosecond (/proc/PID/task/*/schedstat), where CPUTime counts clock
// ticks: for the CPU cost of a step of a few tens of milliseconds.
func RunTime(pid int) (time.Duration, error) {
	paths, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(paths) == 0 {
		return 0, fmt.Errorf("no threads of %d: %v", pid, err)
	}
	var sum time.Duration
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that exited meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: empty", p)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %v", p, err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// Machine describes where a run takes place: CPU model and count, memory,
// kernel, Go and dnsperf versions, each where it can be read.
func Machine() map[string]string {
	m := map[string]string{"cpu": CPUModel()}
	sh := func(key string, name string, args ...string) {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err == nil {
			m[key] = strings.TrimSpace(string(out))
		}
	}
	sh("nproc", "nproc")
	sh("kernel", "uname", "-sr")
	sh("go", "go", "version")
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, err := ParseStatusKB(b, "MemTotal"); err == nil {
			m["memory"] = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<30))
		}
	}
	if out, err := exec.Command("dnsperf", "-h").CombinedOutput(); err == nil || len(out) > 0 {
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "Version") {
				m["dnsperf"] = strings.TrimSpace(line)
			}
		}
	}
	return m
}

// LoadAverage is the machine's 1, 5 and 15 minute load averages: how much
// else ran beside a measurement.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
