package testenv

import (
	"net"
	"strconv"
	"sync"
	"testing"
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
