//go:build linux

package harness

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParsers(t *testing.T) {
	stat := []byte("4242 (core dns) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 100 2000000 3000 18446744073709551615\n")
	d, err := ParseStatCPU(stat, 100)
	if err != nil || d != 3*time.Second {
		t.Errorf("ParseStatCPU = %v, %v; want 3s", d, err)
	}
	status := []byte("Name:\tcoredns\nVmPeak:\t  10 kB\nVmRSS:\t  268764 kB\nThreads:\t9\n")
	b, err := ParseStatusKB(status, "VmRSS")
	if err != nil || b != 268764<<10 {
		t.Errorf("ParseStatusKB = %v, %v", b, err)
	}
	if _, err := ParseStatusKB(status, "VmSwap"); err == nil {
		t.Error("missing field found")
	}
}

// TestStartStop runs a process that would outlive the test, reads its
// memory and CPU time, and stops it.
func TestStartStop(t *testing.T) {
	p, err := Start("sleep", filepath.Join(t.TempDir(), "sleep.log"), exec.Command("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Exited() || p.Err() != nil {
		t.Fatalf("exited at once: %v", p.Err())
	}
	if n, err := RSS(p.Pid()); err != nil || n <= 0 {
		t.Errorf("RSS = %d, %v", n, err)
	}
	if _, err := CPUTime(p.Pid()); err != nil {
		t.Errorf("CPUTime: %v", err)
	}
	p.Stop(5 * time.Second)
	if !p.Exited() || p.Err() == nil {
		t.Errorf("after Stop: exited %v, err %v; want a signal", p.Exited(), p.Err())
	}
}

// TestPortsFree finds a port listened on taken, and one closed again free.
func TestPortsFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if err := PortsFree(port, port+1); err == nil {
		t.Fatalf("port %d, listened on, reported free", port)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	if err := PortsFree(free, free+1); err != nil {
		t.Fatalf("port %d, closed, reported taken: %v", free, err)
	}
}

func TestRunTime(t *testing.T) {
	before, err := RunTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 20_000_000 { // some CPU, however long it takes
		x ^= i * i
	}
	after, err := RunTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("run time %v then %v (%d): it did not grow", before, after, x)
	}
	if _, err := RunTime(-1); err == nil {
		t.Error("no error for pid -1")
	}
}

func TestPinned(t *testing.T) {
	for _, tc := range []struct {
		cpu, nice int
		want      string
	}{
		{-1, 0, "coredns -conf C"},
		{1, 0, "taskset -c 1 coredns -conf C"},
		{-1, -10, "nice -n -10 coredns -conf C"},
		{0, 5, "nice -n 5 taskset -c 0 coredns -conf C"},
	} {
		if got := strings.Join(Pinned(tc.cpu, tc.nice, "coredns", "-conf", "C"), " "); got != tc.want {
			t.Errorf("Pinned(%d, %d): %q, want %q", tc.cpu, tc.nice, got, tc.want)
		}
	}
}
