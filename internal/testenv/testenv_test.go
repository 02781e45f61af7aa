package testenv

import (
	"context"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFreePortTakesBothProtocols(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("TCP on the free port: %v", err)
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("UDP on the free port: %v", err)
	}
	u.Close()
}

func TestLogBufferKeepsConcurrentWrites(t *testing.T) {
	var b LogBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Fatalf("%d bytes kept of 800 written", n)
	}
}

// TestUDPSocketsCountsSharers binds a port with SO_REUSEPORT twice, as two
// CoreDNS servers can, on 127.0.0.1 and on ::1, and counts each.
func TestUDPSocketsCountsSharers(t *testing.T) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); cerr != nil {
			return cerr
		}
		return err
	}}
	for _, host := range []string{"127.0.0.1", "::1"} {
		first, err := lc.ListenPacket(context.Background(), "udp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		addr := first.LocalAddr().String()
		if n := UDPSockets(addr); n != 1 {
			t.Fatalf("%s: %d sockets counted, want 1", addr, n)
		}
		second, err := lc.ListenPacket(context.Background(), "udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if n := UDPSockets(addr); n != 2 {
			t.Errorf("%s shared: %d sockets counted, want 2", addr, n)
		}
		second.Close()
		if n := UDPSockets(addr); n != 1 {
			t.Errorf("%s after the second closed: %d sockets counted, want 1", addr, n)
		}
	}
}

// TestFreePortNeverTwice: the ports a process is given are all different,
// whatever the kernel hands out again once one is closed.
func TestFreePortNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
	}
}
