package frontend

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A threadSocket is a UDP socket outside the runtime's poller, in blocking
// mode, read by a goroutine that waits in recvmmsg itself (`wait thread`,
// the default). The kernel wakes that goroutine's thread straight from the
// datagram's arrival, and a lone request costs the thread's wake-up, one
// recvmmsg and one sendmmsg: no epoll_wait, no read that finds the socket
// empty, and no hand-over between the thread that polls and the one that
// runs the goroutine, which the poller's wait costs every lone request.
//
// A goroutine in a system call keeps its P (GOMAXPROCS's unit) until sysmon
// takes it back for other work, so each reader is given one of its own and
// the rest of the server another (raiseProcs): otherwise every request
// queued behind a waiting reader would cost a hand-over of its P.
type threadSocket struct {
	v6     bool // AF_INET6, whose clients of IPv4 have mapped addresses
	local  net.Addr
	closed atomic.Bool // shut down: the reader leaves

	// fd is -1 once closed. The reader uses it without the lock, as only
	// it closes it while it reads; the chain's replies, which come from
	// goroutines of their own as late as they please, take the lock, so
	// that none goes to a file that took the number since.
	mu sync.RWMutex
	fd int

	// reading, nil but in tests, is told how the reader reads before each
	// read: the reader's choices, which its replies do not show.
	reading func(readMode)
}

// listenThread opens a socket on addr as listenUDP does, and takes it out
// of the poller: the poller deregisters a socket when its conn closes, and
// a duplicate descriptor keeps the socket open.
func listenThread(addr string) (*threadSocket, error) {
	conn, err := listenUDP(addr)
	if err != nil {
		return nil, err
	}
	s := &threadSocket{fd: -1, local: conn.LocalAddr()}
	raw, err := conn.SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) { s.fd, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		err = errors.Join(cerr, err)
	}
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("taking %s out of the poller: %w", addr, err)
	}
	if err := s.setup(); err != nil {
		unix.Close(s.fd)
		return nil, fmt.Errorf("taking %s out of the poller: %w", addr, err)
	}
	return s, nil
}

// setup makes the socket blocking, with a receive timeout that bounds how
// long close waits for its reader should shutdown(2) not wake it.
func (s *threadSocket) setup() error {
	if err := unix.SetNonblock(s.fd, false); err != nil {
		return err
	}
	if err := unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
		return err
	}
	sa, err := unix.Getsockname(s.fd)
	_, s.v6 = sa.(*unix.SockaddrInet6)
	return err
}

// shutdown wakes the reader, which leaves. The socket still sends the
// chain's replies: it is shut down for reading only.
func (s *threadSocket) shutdown() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.closed.Store(true)
	if s.fd >= 0 {
		unix.Shutdown(s.fd, unix.SHUT_RD) // ENOTCONN, but it wakes the reader
	}
}

// close closes the socket, once: its reader's last act, and the front
// end's for a socket never read.
func (s *threadSocket) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// yieldEvery is how often a reader passes through the scheduler. sysmon
// takes the P of a goroutine that has not been through it for 10 ms
// (forcePreemptNS), as if it ran without end, even while it waits in a
// system call, and every P the reader then takes on its way back is one
// sysmon last saw long ago: it would be taken on every request.
const yieldEvery = 5 * time.Millisecond

// serveThread answers the requests on s until it is closed.
func (fe *frontend) serveThread(s *threadSocket) {
	// A reader that leaves on an error closes its socket at once, which
	// leaves the address's SO_REUSEPORT group, whose datagrams would
	// otherwise still come to it; one that was shut down leaves it to the
	// front end, which closes it once the chain has replied (closeSockets).
	defer func() {
		if !s.closed.Load() {
			s.close()
		}
	}()
	b := newThreadBatch(fe, s)
	yielded := time.Now()
	pause := unix.NsecToTimespec(fe.cfg.coalesce.Nanoseconds())
	last := time.Now()      // when the batch before came in
	interval := maxInterval // the mean time between datagrams
	read := waitRead
	for !s.closed.Load() {
		if s.reading != nil {
			s.reading(read)
		}
		flags := unix.MSG_WAITFORONE
		if read == pauseRead {
			// In the system call, as recvmmsg waits: the thread keeps
			// its P, and no timer of the runtime's is set.
			unix.Nanosleep(&pause, nil)
		}
		if read != waitRead {
			flags = unix.MSG_DONTWAIT
		}
		if !b.wait(flags) {
			read = waitRead
			continue
		}
		t := time.Now()
		if b.timed {
			b.start = t
		}
		if err := b.answerAll(t); err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Errorf("frontend: writing %s: %v", s.local, err)
			}
			return
		}
		interval = arrivals(interval, t.Sub(last), b.received)
		read = nextRead(fe.cfg.coalesce, interval, b.received)
		last = t
		if t.Sub(yielded) >= yieldEvery {
			yielded = t
			runtime.Gosched()
		}
	}
}

// readMode is how a thread reader reads its next batch.
type readMode uint8

const (
	waitRead  readMode = iota // waiting for its first datagram
	takeRead                  // taking what the socket holds, at once
	pauseRead                 // taking it after a pause of coalesce
)

// maxInterval bounds the mean time between datagrams that arrivals
// keeps: an idle spell of any length counts as one far longer than the
// longest pause (maxCoalesce), and is forgotten within a few dozen batches
// once datagrams come often.
const maxInterval = 10 * maxCoalesce

// arrivals returns the mean time between datagrams, interval before a
// batch of received came gap after the batch before: a moving average
// over about the last eight batches.
func arrivals(interval, gap time.Duration, received int) time.Duration {
	per := min(gap, maxInterval) / time.Duration(received)
	return interval - interval/8 + per/8
}

// nextRead returns how a reader that read received datagrams, at a mean
// interval between datagrams, reads next. At rates that leave it idle,
// each datagram costs a wake-up of its thread, and a pause that gathers
// several lets one wake-up answer them all; one that gathers none costs a
// wake-up for nothing. So it pauses where datagrams come at least one and
// a half to a pause on average, and otherwise waits for the next, which
// keeps the scattered datagrams of lower rates from bringing on pauses.
// A full batch may have left more in the socket, taken at once: a pause
// after each would cap the rate at a batch a pause.
func nextRead(coalesce, interval time.Duration, received int) readMode {
	switch {
	case coalesce == 0:
		return waitRead
	case received == batchLen:
		return takeRead
	case 2*coalesce >= 3*interval:
		return pauseRead
	}
	return waitRead
}

// newThreadBatch returns the batch of s, read on a thread of its own.
func newThreadBatch(fe *frontend, s *threadSocket) *udpBatch {
	b := newUDPBatch(fe, s.local)
	b.thread = s
	return b
}

// wait reads a batch, with flags MSG_WAITFORONE waiting for its first
// datagram, with MSG_DONTWAIT taking what the socket holds, and reports
// whether it read one.
func (b *udpBatch) wait(flags int) bool {
	for i := range b.used {
		b.readySlot(i)
	}
	b.used = 0
	n, _, errno := syscall.Syscall6(unix.SYS_RECVMMSG, uintptr(b.thread.fd), uintptr(unsafe.Pointer(&b.in[0])), batchLen, uintptr(flags), 0, 0)
	// Once the socket is shut down, the batch is still answered: the
	// datagrams it holds are read, and would be lost. What a shut-down
	// socket reads once its queue is empty, an empty datagram of no
	// source, handle skips.
	switch {
	case errno == unix.EAGAIN || errno == unix.EINTR:
		return false
	case errno != 0:
		// As in the poller: the socket stays, and the error is not the
		// requests', whose datagrams the kernel dropped or kept.
		b.used = batchLen // whatever the kernel wrote
		time.Sleep(time.Millisecond)
		return false
	}
	b.received, b.used = int(n), int(n)
	return n > 0
}

// sendAll sends b's queued replies, waiting while the socket's buffer is
// full: a reader leaves, once its socket shut down, and a drain after it
// answers what is left.
func (s *threadSocket) sendAll(b *udpBatch) error {
	for !b.send(uintptr(s.fd)) {
		fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(fds, 100); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if s.closed.Load() && !b.draining {
			return net.ErrClosed
		}
	}
	return nil
}

// sendmsg sends one of the chain's replies to the client at to, from the
// source the control message oob names, if any.
func (s *threadSocket) sendmsg(p, oob []byte, to netip.AddrPort) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd < 0 {
		return 0, net.ErrClosed
	}
	return unix.SendmsgN(s.fd, p, oob, sockaddrOf(to, s.v6), 0)
}

// sockaddrOf returns the address to send to from a socket of the family
// v6 says: an IPv4 client of a dual-stack socket as its mapped address, and
// a link-local client with the interface index withScope put in its zone.
func sockaddrOf(to netip.AddrPort, v6 bool) unix.Sockaddr {
	if !v6 {
		return &unix.SockaddrInet4{Addr: to.Addr().Unmap().As4(), Port: int(to.Port())}
	}
	sa := &unix.SockaddrInet6{Addr: to.Addr().As16(), Port: int(to.Port())}
	if id, err := strconv.ParseUint(to.Addr().Zone(), 10, 32); err == nil {
		sa.ZoneId = uint32(id)
	}
	return sa
}

// readers counts the threadSockets being read, in every front end, and
// holds GOMAXPROCS as it was before raiseProcs first raised it.
var readers struct {
	sync.Mutex
	n     int
	procs int
}

// procs returns GOMAXPROCS as it was before a front end raised it: the
// CPUs the server was given, and the default number of sockets.
func procs() int {
	readers.Lock()
	defer readers.Unlock()
	if readers.procs != 0 {
		return readers.procs
	}
	return runtime.GOMAXPROCS(0)
}

// raiseProcs counts n readers more (fewer, if negative) and raises
// GOMAXPROCS, if needed, to one more than the readers, so that the rest
// of the server has a P while every reader waits in its system call. It
// never lowers it.
func raiseProcs(n int) {
	readers.Lock()
	defer readers.Unlock()
	readers.n += n
	if p := runtime.GOMAXPROCS(0); p <= readers.n {
		if readers.procs == 0 {
			readers.procs = p
		}
		runtime.GOMAXPROCS(readers.n + 1)
		log.Infof("frontend: GOMAXPROCS raised from %d to %d: each of the %d UDP readers keeps a P while it waits", p, readers.n+1, readers.n)
	}
}
