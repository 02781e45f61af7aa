package frontend

import (
	"errors"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// queued accepts the connections that wait in l's queue, at most max,
// without waiting for more: Accept, past l's deadline, would take none.
func queued(l net.Listener, max int) []net.Conn {
	sc, ok := l.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var conns []net.Conn
	raw.Control(func(fd uintptr) {
		for len(conns) < max {
			nfd, _, err := unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			if errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.EINTR) {
				continue // reset while queued: the next
			}
			if err != nil {
				return // EAGAIN: none left
			}
			f := os.NewFile(uintptr(nfd), "")
			conn, err := net.FileConn(f)
			f.Close()
			if err == nil {
				conns = append(conns, conn)
			}
		}
	})
	return conns
}
