package testenv

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUDPSocketsCountsSharers binds a port with SO_REUSEPORT twice, as two
// CoreDNS servers can, on 127.0.0.1 and on ::1, and counts each: in
// /proc/net, which only Linux has.
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
