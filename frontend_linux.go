package compactcache

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UDP front end reads and writes datagrams in batches, one system call
// for up to batchLen of them each way (recvmmsg(2), sendmmsg(2)), through
// the socket's RawConn so that the Go runtime's poller still parks the
// goroutine while there is nothing to read. Everything a batch needs is
// allocated once per socket: a hit allocates nothing.

const (
	batchLen = 64
	// maxRequest is the room for one request; a longer one is cut by the
	// kernel (MSG_TRUNC), dropped and counted.
	maxRequest = 4096
)

// udpBatch is one socket's buffers and the state of its system calls.
type udpBatch struct {
	fe    *frontend
	conn  *net.UDPConn
	raw   syscall.RawConn
	local net.Addr

	in      [batchLen]unix.Mmsghdr
	inIov   [batchLen]unix.Iovec
	names   [batchLen]unix.RawSockaddrInet6 // room for both families
	bufs    [batchLen][maxRequest]byte
	scratch [batchLen]*scratch // each slot's reply lives in its scratch
	out     [batchLen]unix.Mmsghdr
	outIov  [batchLen]unix.Iovec

	received, queued, sent int
	errno                  syscall.Errno
	sinceLogged            int

	// The RawConn callbacks, made once: a method value made per call
	// would allocate.
	recvFn, sendFn func(fd uintptr) bool
}

func newUDPBatch(fe *frontend, conn *net.UDPConn) (*udpBatch, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	b := &udpBatch{fe: fe, conn: conn, raw: raw, local: conn.LocalAddr()}
	for i := range batchLen {
		b.inIov[i].Base = &b.bufs[i][0]
		b.inIov[i].SetLen(maxRequest)
		b.in[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		b.in[i].Hdr.Iov = &b.inIov[i]
		b.in[i].Hdr.SetIovlen(1)
		b.scratch[i] = scratchPool.New().(*scratch)
	}
	b.recvFn, b.sendFn = b.recv, b.send
	return b, nil
}

// serveUDP answers the requests on conn until it is closed.
func (fe *frontend) serveUDP(conn *net.UDPConn) {
	b, err := newUDPBatch(fe, conn)
	if err != nil {
		log.Errorf("frontend: %s: %v", conn.LocalAddr(), err)
		return
	}
	for {
		if err := b.raw.Read(b.recvFn); err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Errorf("frontend: reading %s: %v", b.local, err)
			}
			return
		}
		if b.errno != 0 {
			// ICMP errors of earlier replies surface here; the socket is fine.
			time.Sleep(time.Millisecond)
			continue
		}
		now := fe.c.now()
		b.queued = 0
		for i := range b.received {
			b.handle(i, now)
		}
		if b.queued > 0 {
			b.sent = 0
			if err := b.raw.Write(b.sendFn); err != nil {
				return
			}
		}
	}
}

// handle answers the request in slot i, or hands it to the chain.
func (b *udpBatch) handle(i int, now time.Time) {
	fe := b.fe
	h := &b.in[i]
	if h.Hdr.Flags&unix.MSG_TRUNC != 0 {
		fe.fm.dropped.Inc()
		return
	}
	pkt := b.bufs[i][:h.Len]
	client := addrPortOf(&b.names[i])
	s := b.scratch[i]
	if reply := fe.answer(s, pkt, client.Addr(), false, now); reply != nil {
		k := b.queued
		b.outIov[k].Base = &reply[0]
		b.outIov[k].SetLen(len(reply))
		b.out[k] = unix.Mmsghdr{Hdr: unix.Msghdr{Name: h.Hdr.Name, Namelen: h.Hdr.Namelen, Iov: &b.outIov[k]}}
		b.out[k].Hdr.SetIovlen(1)
		b.queued++
		fe.logHit(&b.sinceLogged, &s.q, len(pkt), reply, client, "udp")
		return
	}
	fe.toChain(pkt, &chainWriter{local: b.local, remote: net.UDPAddrFromAddrPort(client), udp: b.conn, to: client})
}

// recv reads a batch; false asks the poller to wait for the socket.
func (b *udpBatch) recv(fd uintptr) bool {
	for i := range batchLen {
		b.in[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.in[i].Hdr.Flags = 0
		b.in[i].Len = 0
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.in[0])), batchLen, unix.MSG_DONTWAIT, 0, 0)
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	b.received, b.errno = int(n), errno
	if errno != 0 {
		b.received = 0
	}
	return true
}

// send writes the queued replies; false asks the poller to wait until the
// socket takes more. A reply the kernel refuses is skipped and counted.
func (b *udpBatch) send(fd uintptr) bool {
	for b.sent < b.queued {
		n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.out[b.sent])), uintptr(b.queued-b.sent), unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			b.sent += int(n)
		case unix.EAGAIN, unix.EINTR:
			return false
		default:
			b.fe.fm.dropped.Inc()
			b.sent++
		}
	}
	return true
}

// addrPortOf reads a socket address the kernel wrote, of either family;
// the port is in network byte order in both.
func addrPortOf(sa *unix.RawSockaddrInet6) netip.AddrPort {
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	port := uint16(p[0])<<8 | uint16(p[1])
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
	}
	return netip.AddrPort{}
}
