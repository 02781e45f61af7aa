//go:build linux

// Package proc runs the servers of the end-to-end tools (bench/e2e,
// bench/soak) as child processes and reads what Linux says of them: CPU
// time and resident memory from /proc.
package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
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

// BuildCoreDNS builds ./cmd/coredns into bin, its output on stderr; the
// tool runs from the repository's root.
func BuildCoreDNS(ctx context.Context, bin string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/coredns")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/coredns (run from the repository's root): %v", err)
	}
	return nil
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

// PortsFree checks that the ports in [from, end) are free for both TCP and
// UDP on 127.0.0.1, before a run starts servers on them.
func PortsFree(from, end int) error {
	for port := from; port < end; port++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("port %d is taken: %v", port, err)
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("udp port %d is taken: %v", port, err)
		}
		u.Close()
	}
	return nil
}

// FreePort returns a port of 127.0.0.1 free for TCP and UDP just now, with
// the port after it (PortsFree), for a server the tool starts.
func FreePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if PortsFree(port, port+1) == nil {
			return port, nil
		}
	}
	return 0, errors.New("no port of 127.0.0.1 free for TCP and UDP with the one after it")
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
