package frontend

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UDP front end reads datagrams in batches of up to batchLen, one
// system call a batch (recvmmsg(2)), and sends the replies of each in a few
// runs (sendmmsg(2), see answerAll). Everything a batch needs is allocated
// once per socket: a hit allocates nothing. A socket's reader waits for
// datagrams on a thread of its own, blocking in recvmmsg (`wait thread`,
// udp_thread_linux.go), or in the Go runtime's poller (`wait poller`, this
// file's serveUDP), through the socket's RawConn.
//
// Sends, and the poller's receives, are made raw (RawSyscall6), outside
// the runtime's system call state: with MSG_DONTWAIT they never sleep, and a
// batch of sends is long enough for sysmon to take the P of a thread in a
// system call and hand it to another, which then waits in epoll_wait, is
// woken by each reply's send buffer coming free (the socket is in the
// poller for writing too), and takes the goroutine over when the call
// returns. Those thread switches cost more than the calls. What the raw
// call gives up is preemption during one batch's call: the garbage
// collector's stop waits for it to return.

const (
	batchLen = 64
	// maxRequest is the room for one request: what miekg/dns's server
	// reads of a datagram (its UDPSize, which CoreDNS leaves at 512). The
	// kernel cuts a longer one there, and it is read as the server reads it.
	maxRequest = 512
)

// udpBatch is one socket's buffers and the state of its system calls.
type udpBatch struct {
	fe    *frontend
	local net.Addr

	// The socket: conn, through the poller (wait poller), or thread.
	conn   *net.UDPConn
	raw    syscall.RawConn
	thread *threadSocket

	in     [batchLen]unix.Mmsghdr
	inIov  [batchLen]unix.Iovec
	names  [batchLen]unix.RawSockaddrInet6 // room for both families
	bufs   [batchLen][maxRequest]byte
	answer [batchLen][]Answerer // by block; each slot's reply lives in its Answerers
	reader *reader

	// hits are the queued replies' hits, by place in out, for account.
	hits [batchLen]sentHit

	timed     bool           // the batch is timed, for series or access logs
	start     time.Time      // when the batch came in
	localPort netip.AddrPort // the socket's address, for access log lines
	out       [batchLen]unix.Mmsghdr
	outIov    [batchLen]unix.Iovec

	// On a socket bound to the unspecified address, each reply leaves from
	// the address its request came to, as miekg/dns's server sends it: the
	// kernel would send it from the address of its route to the client,
	// which on a host of several addresses need not be the one the client
	// asked, and the client drops it. The kernel gives each request's
	// destination in a control message (IP_PKTINFO, IPV6_PKTINFO) in inOOB,
	// and a reply's control message in outOOB names it as the source. The
	// buffers are of uint64, for the control messages' alignment.
	pktinfo bool
	inOOB   [batchLen][oobLen / 8]uint64
	outOOB  [batchLen][oobLen / 8]uint64

	received, queued, sent int
	used                   int // slots the kernel may have written since readied
	errno                  syscall.Errno
	sendErr                error // the socket's writes failed: it is closed
	draining               bool  // drain's: what waits in the socket is answered, though it shut down

	// The RawConn callbacks, made once: a method value made per call
	// would allocate.
	serveFn, sendFn func(fd uintptr) bool
}

// sentHit is what the bookkeeping of a hit needs once its reply is sent.
type sentHit struct {
	block   int
	slot    int // of its request
	client  netip.AddrPort
	hit     Hit
	refused bool // by the kernel, on send
}

// newUDPBatch returns the buffers of a socket bound to local, without the
// socket.
func newUDPBatch(fe *frontend, local net.Addr) *udpBatch {
	b := &udpBatch{fe: fe, local: local}
	b.pktinfo = unspecified(local) // listenUDP asked for the destinations
	for i := range batchLen {
		b.inIov[i].Base = &b.bufs[i][0]
		b.inIov[i].SetLen(maxRequest)
		b.in[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		b.in[i].Hdr.Iov = &b.inIov[i]
		b.in[i].Hdr.SetIovlen(1)
		b.readySlot(i)
		b.answer[i] = fe.answerers()
	}
	b.reader, b.timed = fe.newReader(), fe.timed()
	if u, ok := b.local.(*net.UDPAddr); ok {
		b.localPort = u.AddrPort()
	}
	return b
}

// newPollerBatch returns the batch of conn, read through the poller.
func newPollerBatch(fe *frontend, conn *net.UDPConn) (*udpBatch, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	b := newUDPBatch(fe, conn.LocalAddr())
	b.conn, b.raw = conn, raw
	b.serveFn, b.sendFn = b.serve, b.send
	return b, nil
}

// serveUDP answers the requests on conn until the front end closes.
func (fe *frontend) serveUDP(conn *net.UDPConn) {
	b, err := newPollerBatch(fe, conn)
	if err != nil {
		log.Errorf("frontend: %s: %v", conn.LocalAddr(), err)
		return
	}
	for !fe.stopping.Load() {
		if err := b.raw.Read(b.serveFn); err != nil {
			if !errors.Is(err, net.ErrClosed) && !fe.stopping.Load() {
				log.Errorf("frontend: reading %s: %v", b.local, err)
			}
			return
		}
		if b.sendErr != nil {
			return
		}
		// ICMP errors of earlier replies surface here; the socket is fine.
		time.Sleep(time.Millisecond)
	}
}

// serve is serveUDP's read callback: it reads batches and answers them
// until the socket is drained, then asks the poller to wait. It returns
// true, ending the read, for an error to read or send, and when the front
// end closes.
//
// A batch short of batchLen drained the socket when it was read, so every
// datagram queued since has woken the poller (the socket is edge-triggered),
// and the callback goes back to it at once, without the read that would
// only fail with EAGAIN: within one RawConn.Read, a wake-up that came while
// the batch was answered is kept for the wait, whereas a new Read forgets
// it and must probe the socket first. A full batch may have left datagrams
// whose wake-up the batch itself took, so the next is read at once.
func (b *udpBatch) serve(fd uintptr) bool {
	for {
		if b.fe.stopping.Load() {
			return true // a stream of full batches never waits for the deadline
		}
		if !b.next(fd) {
			return false
		}
		if b.errno != 0 || b.sendErr != nil {
			return true
		}
		if b.received < batchLen {
			return false
		}
	}
}

// next reads a batch and answers it; false when the socket is empty. The
// batch's errno and sendErr say whether the read or a send failed.
func (b *udpBatch) next(fd uintptr) bool {
	if !b.recv(fd) {
		return false
	}
	if b.errno == 0 {
		now := time.Now()
		if b.timed {
			b.start = now
		}
		b.sendErr = b.answerAll(now)
	}
	return true
}

// drain answers the datagrams that wait in the socket fd, whose reader
// has left, as serve does, and waits for no more.
func (b *udpBatch) drain(fd uintptr) {
	b.draining = true
	for b.next(fd) && b.errno == 0 && b.sendErr == nil && b.received == batchLen {
	}
}

// drainUDP takes the front end's UDP sockets socks, whose readers have
// left, out of their addresses' SO_REUSEPORT groups, so that the kernel
// gives every datagram that comes from then on to the other front ends'
// sockets, and answers those that wait in them, which their close would
// drop. A front end that never started has them answered by a running one
// on their address, which a failed reload leaves, if any.
func (fe *frontend) drainUDP(socks udpSockets) {
	by := func(local net.Addr) *frontend {
		if fe.server != nil {
			return fe
		}
		return running(fe, local)
	}
	for _, conn := range socks.udp {
		if raw, err := conn.SyscallConn(); err == nil {
			raw.Control(leaveGroup)
		}
	}
	for _, s := range socks.threads {
		leaveGroup(uintptr(s.fd))
	}
	for _, conn := range socks.udp {
		if o := by(conn.LocalAddr()); o != nil {
			if b, err := newPollerBatch(o, conn); err == nil {
				b.raw.Control(b.drain)
			}
		}
	}
	for _, s := range socks.threads {
		if o := by(s.local); o != nil {
			newThreadBatch(o, s).drain(uintptr(s.fd))
		}
	}
}

// leaveGroup connects the UDP socket fd to its own address. A connected
// socket gets only the datagrams of its peer: the kernel gives every other
// to the rest of its SO_REUSEPORT group, and those already queued stay to
// be read. Failing that, drain reads what came meanwhile.
func leaveGroup(fd uintptr) {
	if sa, err := unix.Getsockname(int(fd)); err == nil {
		unix.Connect(int(fd), sa)
	}
}

// answerAll answers the batch read and sends its replies in runs of 1, 2,
// 4 and so on. Requests queue up while the server sleeps or works, so the
// first of a batch has waited longest; one send for the whole batch would
// hold its reply until the last request is answered. With runs that
// double, a reply waits for at most as many requests read after it as
// before it, and a full batch costs log2(batchLen)+1 sends, not one per
// reply.
func (b *udpBatch) answerAll(now time.Time) error {
	b.queued = 0
	run := 1
	for i := range b.received {
		b.handle(i, now)
		if b.queued == run || b.queued > 0 && i == b.received-1 {
			err := b.sendQueued()
			b.account()
			if err != nil {
				b.dropFrom(i + 1)
				return err
			}
			b.queued = 0
			run *= 2
		}
	}
	return nil
}

// dropFrom counts the requests of the batch from slot i on as dropped: a
// send failed, as the socket closed, and they are left unanswered.
func (b *udpBatch) dropFrom(i int) {
	for ; i < b.received; i++ {
		if b.in[i].Hdr.Namelen != 0 { // a datagram (handle)
			b.fe.counters(b.bufs[i][:b.in[i].Len]).Dropped.Inc()
		}
	}
}

// sendQueued sends the queued replies, waiting while the socket's buffer is
// full.
func (b *udpBatch) sendQueued() error {
	b.sent = 0
	if b.thread != nil {
		return b.thread.sendAll(b)
	}
	return b.raw.Write(b.sendFn)
}

// sender is the batch's socket, for the chain's replies.
func (b *udpBatch) sender() udpSender {
	if b.thread != nil {
		return b.thread
	}
	return pollerConn{b.conn}
}

// account counts the hits of the run just sent, with one reading of the
// clock for the run.
func (b *udpBatch) account() {
	var took time.Duration
	if b.timed {
		took = time.Since(b.start)
	}
	for k := range b.queued {
		h := &b.hits[k]
		reply := unsafe.Slice(b.outIov[k].Base, b.outIov[k].Len)
		b.fe.account(b.reader, h.block, b.bufs[h.slot][:b.in[h.slot].Len], reply, b.localPort, h.client, false, k < b.sent && !h.refused, &h.hit, took)
	}
}

// handle answers the request in slot i, or hands it to the chain.
func (b *udpBatch) handle(i int, now time.Time) {
	fe := b.fe
	h := &b.in[i]
	if h.Hdr.Namelen == 0 {
		return // no datagram: the end of a thread socket shut down (wait)
	}
	pkt := b.bufs[i][:h.Len]
	client := addrPortOf(&b.names[i])
	k := b.queued
	sent := &b.hits[k]
	if reply, block := fe.answer(b.answer[i], pkt, client.Addr(), false, now, &sent.hit); reply != nil {
		sent.block, sent.slot, sent.client, sent.refused = block, i, client, false
		b.outIov[k].Base = &reply[0]
		b.outIov[k].SetLen(len(reply))
		b.out[k] = unix.Mmsghdr{Hdr: unix.Msghdr{Name: h.Hdr.Name, Namelen: h.Hdr.Namelen, Iov: &b.outIov[k]}}
		b.out[k].Hdr.SetIovlen(1)
		if b.pktinfo {
			oob := oobBytes(&b.outOOB[k])
			if n := replySource(oob, b.requestOOB(i)); n > 0 {
				b.out[k].Hdr.Control = &oob[0]
				b.out[k].Hdr.SetControllen(n)
			}
		}
		b.queued++
		return
	}
	client = withScope(client, &b.names[i])
	w := &chainWriter{local: b.local, remote: net.UDPAddrFromAddrPort(client), udp: b.sender(), fe: fe, to: client}
	if b.pktinfo {
		// The chain replies later, from its own goroutine: its own copy.
		oob := oobBytes(new([oobLen / 8]uint64))
		w.oob = oob[:replySource(oob, b.requestOOB(i))]
	}
	fe.toChain(pkt, w)
}

// oobLen is the room for the one control message a request or a reply
// carries here, IPV6_PKTINFO's or IP_PKTINFO's.
const oobLen = 64

func oobBytes(b *[oobLen / 8]uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), oobLen)
}

// requestOOB returns the control messages the kernel gave with the request
// in slot i.
func (b *udpBatch) requestOOB(i int) []byte {
	return oobBytes(&b.inOOB[i])[:min(int(b.in[i].Hdr.Controllen), oobLen)]
}

// askDestinations has the kernel give each request's destination address
// with it: IPV6_PKTINFO on an IPv6 socket, which gives IPv4 requests' too,
// as mapped addresses, and IP_PKTINFO on an IPv4 one.
func askDestinations(conn *net.UDPConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	cerr := raw.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, err = unix.Getsockname(int(fd)); err != nil {
			return
		}
		if _, v6 := sa.(*unix.SockaddrInet6); v6 {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		} else {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		}
	})
	if cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("asking for requests' destinations: %w", err)
	}
	return nil
}

// replySource writes into dst, 8-byte aligned, the control message that
// sends a reply from the destination that the request's control messages
// in oob name, and returns its length: 0 when they name none. An IPv4
// destination, mapped or not, goes in IP_PKTINFO, as miekg/dns sends it:
// kernels before 4.5 ignore a mapped address in IPV6_PKTINFO. The interface
// is left to the routing, as there.
func replySource(dst, oob []byte) int {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		n := int(h.Len)
		if n < unix.SizeofCmsghdr || n > len(oob) {
			return 0
		}
		data := oob[unix.CmsgLen(0):n]
		switch {
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			got := (*unix.Inet6Pktinfo)(unsafe.Pointer(&data[0]))
			if a := netip.AddrFrom16(got.Addr); a.Is4In6() {
				return putPktinfo4(dst, a.As4())
			}
			put := (*unix.Inet6Pktinfo)(unsafe.Pointer(&dst[unix.CmsgLen(0)]))
			*put = unix.Inet6Pktinfo{Addr: got.Addr}
			return putCmsgHeader(dst, unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, unix.SizeofInet6Pktinfo)
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			// Addr is the header's destination; Spec_dst, the local address
			// the kernel routed the request to, may differ.
			return putPktinfo4(dst, (*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0])).Addr)
		}
		oob = oob[min(unix.CmsgSpace(len(data)), len(oob)):]
	}
	return 0
}

// putPktinfo4 writes into dst the IP_PKTINFO control message that sends
// from addr, and returns its length.
func putPktinfo4(dst []byte, addr [4]byte) int {
	put := (*unix.Inet4Pktinfo)(unsafe.Pointer(&dst[unix.CmsgLen(0)]))
	*put = unix.Inet4Pktinfo{Spec_dst: addr}
	return putCmsgHeader(dst, unix.IPPROTO_IP, unix.IP_PKTINFO, unix.SizeofInet4Pktinfo)
}

// putCmsgHeader writes the header of a control message of n bytes of data
// at the start of dst, and returns the message's length with its padding.
func putCmsgHeader(dst []byte, level, typ int32, n int) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&dst[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(n))
	return unix.CmsgSpace(n)
}

// recv reads a batch; false asks the poller to wait for the socket.
func (b *udpBatch) recv(fd uintptr) bool {
	for i := range b.used {
		b.readySlot(i)
	}
	b.used = 0
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.in[0])), batchLen, unix.MSG_DONTWAIT, 0, 0)
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	b.received, b.errno = int(n), errno
	b.used = b.received
	if errno != 0 {
		b.received, b.used = 0, batchLen // whatever the kernel wrote
	}
	return true
}

// readySlot sets the lengths and flags of slot i's header, which the
// kernel rewrites when it fills the slot. recv readies only the slots of
// the last batch again, not all batchLen: each header is a cache line of
// its own, and a lone request should not pay for a full batch's.
func (b *udpBatch) readySlot(i int) {
	h := &b.in[i]
	h.Hdr.Namelen = unix.SizeofSockaddrInet6
	h.Hdr.Flags = 0
	h.Len = 0
	if b.pktinfo {
		h.Hdr.Control = (*byte)(unsafe.Pointer(&b.inOOB[i][0]))
		h.Hdr.SetControllen(oobLen)
	}
}

// send writes the queued replies; false says the socket's buffer is full,
// and the caller waits until it takes more (the poller, or sendAll). A
// reply the kernel refuses is skipped and counted.
func (b *udpBatch) send(fd uintptr) bool {
	for b.sent < b.queued {
		n, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.out[b.sent])), uintptr(b.queued-b.sent), unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			b.sent += int(n)
		case unix.EAGAIN, unix.EINTR:
			return false
		default:
			if h := &b.out[b.sent].Hdr; h.Controllen != 0 {
				// No reply can leave from a broadcast or multicast
				// destination: the routing's source then, as without.
				h.Control = nil
				h.SetControllen(0)
				continue
			}
			b.hits[b.sent].refused = true
			b.sent++
		}
	}
	return true
}

// withScope gives client, read from sa, sa's IPv6 scope as its zone: a
// link-local client is reached only through the interface it came by. A
// hit's reply reuses sa itself; the chain's is sent to client.
func withScope(client netip.AddrPort, sa *unix.RawSockaddrInet6) netip.AddrPort {
	if sa.Family != unix.AF_INET6 || sa.Scope_id == 0 {
		return client
	}
	return netip.AddrPortFrom(client.Addr().WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10)), client.Port())
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
