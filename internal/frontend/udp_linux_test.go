package frontend

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// hitBatch returns a UDP batch of a front end whose first slot holds a
// request its cache answers, and that answer.
func hitBatch(tb testing.TB) (*udpBatch, *dns.Msg) {
	req := new(dns.Msg).SetQuestion("www.example.org.", dns.TypeA)
	req.SetEdns0(1232, true)
	want := new(dns.Msg).SetReply(req)
	want.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "www.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 1)}}
	reply, err := want.Pack()
	if err != nil {
		tb.Fatal(err)
	}
	c := cannedCache{reply: reply}

	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	fe := &frontend{cfg: &Config{}, blocks: []*block{{cache: c, fm: c.Counters("test")}}, server: &dnsserver.Server{Addr: "dns://127.0.0.1:0"}}
	b, err := newPollerBatch(fe, conn)
	if err != nil {
		tb.Fatal(err)
	}
	pkt, _ := req.Pack()
	copy(b.bufs[0][:], pkt)
	b.in[0].Len = uint32(len(pkt))
	b.names[0].Family = unix.AF_INET
	return b, want
}

// TestFrontendHitAllocatesNothing answers a hit from a batch slot the way
// the socket loop does and counts allocations: on a socket of one address,
// and on one of the unspecified address, whose replies name their source.
func TestFrontendHitAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector; .ci/run runs this test without it")
	}
	for _, unspecified := range []bool{false, true} {
		b, want := hitBatch(t)
		if unspecified {
			b.pktinfo = true
			dst := unix.Inet6Pktinfo{Addr: netip.MustParseAddr("2001:db8::53").As16()}
			b.in[0].Hdr.SetControllen(copy(oobBytes(&b.inOOB[0]), cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, asBytes(&dst))))
		}
		now := time.Now()
		allocs := testing.AllocsPerRun(1000, func() {
			b.queued = 0
			b.handle(0, now)
			b.account()
		})
		if b.queued != 1 {
			t.Fatalf("unspecified %v: the hit was not queued for sending", unspecified)
		}
		got := new(dns.Msg)
		if err := got.Unpack(unsafe.Slice(b.outIov[0].Base, b.outIov[0].Len)); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("unspecified %v: front end reply\n%s\nplugin reply\n%s", unspecified, got, want)
		}
		if named := b.out[0].Hdr.Controllen != 0; named != unspecified {
			t.Errorf("unspecified %v: the reply names its source: %v", unspecified, named)
		}
		if allocs != 0 {
			t.Errorf("unspecified %v: %v allocations per hit, want 0", unspecified, allocs)
		}
	}
}

// BenchmarkFrontendHit is the front end's work for one hit between the
// system calls: parse, lookup, reply, queue.
func BenchmarkFrontendHit(b *testing.B) {
	batch, _ := hitBatch(b)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		batch.queued = 0
		batch.handle(0, now)
		batch.account()
	}
}

// TestReplySource: the source of a reply is the destination of its request,
// from either family's control message, wherever it is among the request's.
func TestReplySource(t *testing.T) {
	v6 := unix.Inet6Pktinfo{Ifindex: 7}
	copy(v6.Addr[:], net.ParseIP("2001:db8::53"))
	v4 := unix.Inet4Pktinfo{Ifindex: 7, Spec_dst: [4]byte{192, 0, 2, 1}, Addr: [4]byte{192, 0, 2, 53}}
	mapped := unix.Inet6Pktinfo{Ifindex: 7, Addr: netip.AddrFrom4(v4.Addr).As16()}
	other := cmsg(unix.SOL_SOCKET, unix.SO_TIMESTAMP, make([]byte, 16))
	short := cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, asBytes(&v4))
	(*unix.Cmsghdr)(unsafe.Pointer(&short[0])).SetLen(8)
	tests := []struct {
		name string
		oob  []byte
		want []byte // nil: no control message
	}{
		{"IPv6", cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, asBytes(&v6)),
			cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, asBytes(&unix.Inet6Pktinfo{Addr: v6.Addr}))},
		{"IPv4 mapped, as a dual-stack socket gets it", cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, asBytes(&mapped)),
			cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, asBytes(&unix.Inet4Pktinfo{Spec_dst: v4.Addr}))},
		{"IPv4", cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, asBytes(&v4)),
			cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, asBytes(&unix.Inet4Pktinfo{Spec_dst: v4.Addr}))},
		{"after another", append(other, cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, asBytes(&v4))...),
			cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, asBytes(&unix.Inet4Pktinfo{Spec_dst: v4.Addr}))},
		{"none", nil, nil},
		{"another only", other, nil},
		{"cut short", cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, asBytes(&v6))[:unix.CmsgLen(8)], nil},
		{"data too short", cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, make([]byte, 8)), nil},
		{"header's length too short", short, nil},
	}
	for _, tc := range tests {
		var buf [oobLen / 8]uint64
		dst := oobBytes(&buf)
		n := replySource(dst, aligned(tc.oob))
		if !bytes.Equal(dst[:n], tc.want) {
			t.Errorf("%s: control message %x, want %x", tc.name, dst[:n], tc.want)
		}
	}
}

// cmsg returns a control message of level and type with data, padded.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

// aligned returns a copy of b in memory aligned as the kernel aligns
// control messages.
func aligned(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	words := make([]uint64, (len(b)+7)/8)
	out := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(b))
	copy(out, b)
	return out
}

func asBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// TestWithScope: a link-local client's address keeps the interface it came
// by, for the chain's reply; others are left as they are.
func TestWithScope(t *testing.T) {
	linkLocal := unix.RawSockaddrInet6{Family: unix.AF_INET6, Scope_id: 3, Addr: netip.MustParseAddr("fe80::1").As16()}
	global := unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: netip.MustParseAddr("2001:db8::1").As16()}
	for _, tc := range []struct {
		sa   *unix.RawSockaddrInet6
		want string
	}{
		{&linkLocal, "[fe80::1%3]:53"},
		{&global, "[2001:db8::1]:53"},
	} {
		tc.sa.Port = 53 << 8 // network byte order
		if got := withScope(addrPortOf(tc.sa), tc.sa).String(); got != tc.want {
			t.Errorf("%s, want %s", got, tc.want)
		}
	}
}

// TestSockaddrOf: a chain's reply in thread mode goes to the address the
// request came from, as withScope gave it: an IPv4 client of an IPv4
// socket, or of a dual-stack one by its mapped address, and a link-local
// client by the interface it came by.
func TestSockaddrOf(t *testing.T) {
	raw := func(addr string, scope uint32) netip.AddrPort {
		sa := &unix.RawSockaddrInet6{Family: unix.AF_INET6, Scope_id: scope, Addr: netip.MustParseAddr(addr).As16(), Port: 53 << 8}
		return withScope(addrPortOf(sa), sa)
	}
	for _, tc := range []struct {
		to   netip.AddrPort
		v6   bool
		want unix.Sockaddr
	}{
		{netip.MustParseAddrPort("192.0.2.1:53"), false, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 1}, Port: 53}},
		{raw("::ffff:192.0.2.1", 0), false, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 1}, Port: 53}},
		{raw("::ffff:192.0.2.1", 0), true, &unix.SockaddrInet6{Addr: netip.MustParseAddr("::ffff:192.0.2.1").As16(), Port: 53}},
		{raw("2001:db8::1", 0), true, &unix.SockaddrInet6{Addr: netip.MustParseAddr("2001:db8::1").As16(), Port: 53}},
		{raw("fe80::1", 3), true, &unix.SockaddrInet6{Addr: netip.MustParseAddr("fe80::1").As16(), Port: 53, ZoneId: 3}},
	} {
		if got := sockaddrOf(tc.to, tc.v6); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s from a socket with v6 %v: %#v, want %#v", tc.to, tc.v6, got, tc.want)
		}
	}
}

// TestListenFailsClean: an address the front end cannot take fails listen
// with the address named, and the sockets it opened before are closed, in
// both ways of waiting: a plain bind of their address, which any socket
// still open there would refuse, then succeeds.
func TestListenFailsClean(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
	taken, err := net.Listen("tcp", addr) // without SO_REUSEPORT: the front end's TCP listen fails
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, poller := range []bool{false, true} {
		fc := &Config{udp: []string{addr}, tcp: []string{addr}, sockets: 2, inflight: 1, poller: poller}
		fe, err := fc.listen()
		if err == nil {
			fe.close()
			t.Fatalf("poller %v: listen on %s, whose TCP port is taken, succeeded", poller, addr)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "frontend: ") || !strings.Contains(msg, addr) {
			t.Errorf("poller %v: %q, want the front end and %s named", poller, msg, addr)
		}
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("poller %v: a UDP socket of the failed listen is still open: %v", poller, err)
		}
		u.Close()
	}
}

// TestAnswerAllSendsInRuns: a batch's replies leave in runs of 1, 2, 4 and
// so on, the last run holding what is left, so that the first requests of a
// batch, which waited longest, do not wait for the whole batch; and the
// hits of a run are counted after its send, not before.
func TestAnswerAllSendsInRuns(t *testing.T) {
	for _, tc := range []struct {
		received int
		runs     []int
	}{
		{1, []int{1}},
		{2, []int{1, 1}},
		{3, []int{1, 2}},
		{7, []int{1, 2, 4}},
		{10, []int{1, 2, 4, 3}},
		{batchLen, []int{1, 2, 4, 8, 16, 32, 1}},
	} {
		b, _ := hitBatch(t)
		for i := 1; i < tc.received; i++ {
			b.bufs[i] = b.bufs[0]
			b.in[i].Len = b.in[0].Len
			b.names[i] = b.names[0]
		}
		b.received = tc.received
		// An access log whose lines nobody writes: what it queued is
		// what was logged.
		b.fe.blocks[0].access = &accessLog{lines: make(chan accessRecord, batchLen)}
		var runs []int
		sent := 0
		b.sendFn = func(uintptr) bool {
			if logged := len(b.fe.blocks[0].access.lines); logged != sent {
				t.Errorf("%d requests: %d hits logged before the send of run %d, want %d, those sent", tc.received, logged, len(runs)+1, sent)
			}
			runs = append(runs, b.queued-b.sent)
			sent += b.queued - b.sent
			b.sent = b.queued
			return true
		}
		if err := b.answerAll(time.Now()); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(runs, tc.runs) {
			t.Errorf("%d requests: sent in runs %v, want %v", tc.received, runs, tc.runs)
		}
		if logged := len(b.fe.blocks[0].access.lines); logged != tc.received {
			t.Errorf("%d requests: %d hits logged, want %d", tc.received, logged, tc.received)
		}
	}
}

// TestRefusedReplyIsNoHit: a hit whose reply the kernel refuses is counted
// once, as dropped: the front end's requests by result add up to those
// read. The reply to port 0 is refused (EINVAL); the one to a listening
// client leaves.
func TestRefusedReplyIsNoHit(t *testing.T) {
	client, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, tc := range []struct {
		name         string
		port         int
		hit, dropped float64
	}{
		{"refused", 0, 0, 1},
		{"sent", client.LocalAddr().(*net.UDPAddr).Port, 1, 0},
	} {
		b, _ := hitBatch(t)
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&b.names[0]))
		sa.Addr = [4]byte{127, 0, 0, 1}
		sa.Port = uint16(tc.port>>8 | tc.port&0xff<<8) // network byte order
		b.in[0].Hdr.Namelen = unix.SizeofSockaddrInet4
		b.received = 1
		if err := b.answerAll(time.Now()); err != nil {
			t.Fatal(err)
		}
		fm := b.fe.blocks[0].fm
		if hit, dropped := testutil.ToFloat64(fm.Hit), testutil.ToFloat64(fm.Dropped); hit != tc.hit || dropped != tc.dropped {
			t.Errorf("%s: %v hits and %v dropped, want %v and %v", tc.name, hit, dropped, tc.hit, tc.dropped)
		}
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 512)); err != nil {
		t.Errorf("the reply sent did not arrive: %v", err)
	}
}

// TestRecvReadiesTheSlotsItFilled: the kernel rewrites the address and
// control lengths of the headers it fills, and recv readies only those of
// the last batch again. Here the filled headers are scribbled over after a
// batch, as a kernel writing short lengths would leave them; the next
// batch, one request longer, must still read every client's address.
func TestRecvReadiesTheSlotsItFilled(t *testing.T) {
	b, _ := hitBatch(t)
	var clients []*net.UDPConn
	for range 3 {
		c, err := net.DialUDP("udp", nil, b.conn.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	for _, batch := range [][]int{{0, 1, 2}, {2, 1, 0, 0}, {1}} {
		for _, c := range batch {
			// Loopback queues the datagram at the receiver before Write returns.
			if _, err := clients[c].Write([]byte{byte(c), 1, 2, 3}); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.raw.Read(b.recv); err != nil {
			t.Fatal(err)
		}
		if b.received != len(batch) {
			t.Fatalf("batch %v: %d received", batch, b.received)
		}
		for i, c := range batch {
			want := clients[c].LocalAddr().(*net.UDPAddr).AddrPort()
			if got := addrPortOf(&b.names[i]); got != want || b.in[i].Len != 4 || b.in[i].Hdr.Flags != 0 {
				t.Errorf("batch %v, slot %d: from %v, %d bytes, flags %#x; want from %v, 4 bytes, no flags", batch, i, got, b.in[i].Len, b.in[i].Hdr.Flags, want)
			}
		}
		for i := range b.received {
			b.in[i].Hdr.Namelen, b.in[i].Hdr.Flags, b.in[i].Len = 1, unix.MSG_TRUNC, 9999
		}
	}
}

// TestServeDrainsWithoutProbing: serve answers batches until one comes in
// short of batchLen, and then returns to the poller without another read,
// which could only fail (recv readies the last batch's slots before each
// read: they are still those of the short batch); a full batch is followed
// by another read at once, since its datagrams' wake-up may have announced
// those behind it too.
func TestServeDrainsWithoutProbing(t *testing.T) {
	for _, n := range []int{1, 5, batchLen, batchLen + 3, 2 * batchLen} {
		b, _ := hitBatch(t)
		pkt := slices.Clone(b.bufs[0][:b.in[0].Len])
		client, err := net.DialUDP("udp", nil, b.conn.LocalAddr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		for range n {
			// Loopback queues the datagram at the receiver before Write returns.
			if _, err := client.Write(pkt); err != nil {
				t.Fatal(err)
			}
		}
		var wait bool
		if err := b.raw.Control(func(fd uintptr) { wait = !b.serve(fd) }); err != nil {
			t.Fatal(err)
		}
		if !wait || b.errno != 0 || b.sendErr != nil {
			t.Fatalf("%d datagrams: serve ended the read (errno %v, send error %v)", n, b.errno, b.sendErr)
		}
		if want := n % batchLen; b.used != want {
			t.Errorf("%d datagrams: the last read took %d, want %d: a read after the short batch, or none after a full one", n, b.used, want)
		}
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 512)
		for i := range n {
			if _, err := client.Read(buf); err != nil {
				t.Fatalf("%d datagrams: reply %d: %v", n, i+1, err)
			}
		}
	}
}

// threadReader starts fe's reader on a thread socket on listen, without
// the socket's receive timeout, so that only shutdown can end the reader's
// wait, and dials the socket's port at dial. done is closed once the
// reader has left.
func threadReader(t *testing.T, fe *frontend, listen, dial string, reading func(readMode)) (s *threadSocket, client *net.UDPConn, done chan struct{}) {
	t.Helper()
	s, err := listenThread(listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	s.reading = reading
	if err := unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{}); err != nil {
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() {
		fe.serveThread(s)
		close(done)
	}()
	server := netip.AddrPortFrom(netip.MustParseAddr(dial), uint16(s.local.(*net.UDPAddr).Port))
	client, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(server))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.SetReadDeadline(time.Now().Add(5 * time.Second)) // a bound on the hang, not a measurement
	return s, client, done
}

// TestThreadReaderAnswersAndLeaves: a socket read by a thread of its own
// answers a hit, a chain's reply leaves from it too, from the address its
// request came to on the unspecified address, and closing wakes its reader
// out of recvmmsg without a request read from the socket shut down: here
// the socket has no receive timeout, so only the wake-up can end the wait.
func TestThreadReaderAnswersAndLeaves(t *testing.T) {
	for _, tc := range []struct {
		listen, dial string
		pktinfo      bool
	}{
		{"127.0.0.1:0", "127.0.0.1", false},
		{"[::1]:0", "::1", false},
		// Dual-stack: an IPv4 client has a mapped address.
		{"[::]:0", "127.0.0.1", true},
	} {
		t.Run(tc.listen, func(t *testing.T) {
			b, want := hitBatch(t)
			fe := b.fe
			s, client, done := threadReader(t, fe, tc.listen, tc.dial, nil)
			pkt := slices.Clone(b.bufs[0][:b.in[0].Len])
			buf := make([]byte, 512)
			if _, err := client.Write(pkt); err != nil {
				t.Fatal(err)
			}
			n, err := client.Read(buf)
			if err != nil {
				t.Fatalf("no reply to the hit: %v", err)
			}
			got := new(dns.Msg)
			if err := got.Unpack(buf[:n]); err != nil || got.String() != want.String() {
				t.Errorf("reply %v (%v), want\n%s", got, err, want)
			}

			var oob []byte
			if tc.pktinfo {
				oob = make([]byte, oobLen)
				oob = oob[:putPktinfo4(oob, netip.MustParseAddr(tc.dial).As4())]
			}
			chainReply := []byte("chain's reply")
			if _, err := s.sendmsg(chainReply, oob, client.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
				t.Fatal(err)
			}
			if n, err := client.Read(buf); err != nil || !bytes.Equal(buf[:n], chainReply) {
				t.Errorf("chain's reply: %q, %v", buf[:n], err)
			}

			fm := fe.blocks[0].fm
			counts := func() [4]float64 {
				return [4]float64{testutil.ToFloat64(fm.Hit), testutil.ToFloat64(fm.Chain), testutil.ToFloat64(fm.Shed), testutil.ToFloat64(fm.Dropped)}
			}
			// The hit is counted after its reply is sent: maybe after the
			// client read it.
			for deadline := time.Now().Add(2 * time.Second); testutil.ToFloat64(fm.Hit) == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			before := counts()
			if before != [4]float64{1, 0, 0, 0} {
				t.Errorf("hit, chain, shed, dropped %v before the shutdown, want the hit alone", before)
			}
			s.shutdown()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the reader still waits in recvmmsg after shutdown")
			}
			if after := counts(); after != before {
				t.Errorf("hit, chain, shed, dropped went from %v to %v across the shutdown", before, after)
			}
		})
	}
}

// TestNextRead: a reader pauses where datagrams come one and a half to a
// pause or more on average, takes at once what a full batch may have
// left, and never pauses without coalesce.
func TestNextRead(t *testing.T) {
	const d = 200 * time.Microsecond
	for _, tc := range []struct {
		name     string
		coalesce time.Duration
		interval time.Duration
		received int
		want     readMode
	}{
		{"off", 0, time.Microsecond, 5, waitRead},
		{"off, a full batch", 0, time.Microsecond, batchLen, waitRead},
		{"2,000 q/s", d, 500 * time.Microsecond, 1, waitRead},
		{"5,000 q/s, two at once", d, d, 2, waitRead},
		{"7,500 q/s", d, d * 2 / 3, 1, pauseRead},
		{"10,000 q/s", d, d / 2, 1, pauseRead},
		{"10,000 q/s, a pause that gathered none", d, d / 2, 0, pauseRead},
		{"a full batch", d, maxInterval, batchLen, takeRead},
		{"a full batch at 10,000 q/s", d, d / 2, batchLen, takeRead},
	} {
		if got := nextRead(tc.coalesce, tc.interval, tc.received); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestArrivals: the mean interval between datagrams follows the rate
// within a few batches, and an idle spell of any length counts as one of
// maxInterval.
func TestArrivals(t *testing.T) {
	interval := maxInterval
	for range 64 {
		interval = arrivals(interval, 100*time.Microsecond, 1)
	}
	if interval < 100*time.Microsecond || interval > 103*time.Microsecond {
		t.Errorf("after 64 batches of one, 100 µs apart: %v, want about 100 µs", interval)
	}
	if got := arrivals(100*time.Microsecond, 200*time.Microsecond, 4); got != 93750*time.Nanosecond {
		t.Errorf("a batch of 4 after 200 µs: %v, want 93.75 µs", got)
	}
	if got := arrivals(100*time.Microsecond, 1000*time.Hour, 1); got != 100*time.Microsecond-12500*time.Nanosecond+maxInterval/8 {
		t.Errorf("after an idle spell: %v", got)
	}
}

// TestThreadReaderCoalesces: a reader whose datagrams come often pauses
// before its reads, and answers what each took; a pause that found
// nothing, and a lone request after an idle spell, bring it back to
// waiting for its next datagram. A reader that kept pausing once it had
// paused would answer all the same, a pause late, waking every pause for
// nothing: what it chose is told to the test, which holds it before each
// read so that a burst is in the socket before the read that takes it.
func TestThreadReaderCoalesces(t *testing.T) {
	b, want := hitBatch(t)
	fe := b.fe
	fe.cfg.coalesce = maxCoalesce
	modes, stop := make(chan readMode), make(chan struct{})
	s, client, done := threadReader(t, fe, "127.0.0.1:0", "127.0.0.1", func(m readMode) {
		select {
		case modes <- m:
		case <-stop:
		}
	})
	// next lets the reader read, and returns how.
	next := func() readMode {
		t.Helper()
		select {
		case m := <-modes:
			return m
		case <-time.After(time.Minute): // a bound on the hang, not a measurement
			t.Fatal("the reader does not read")
			return 0
		}
	}
	pkt := slices.Clone(b.bufs[0][:b.in[0].Len])
	buf := make([]byte, 512)
	sent := 0
	send := func(n int) {
		t.Helper()
		for range n {
			if _, err := client.Write(pkt); err != nil {
				t.Fatal(err)
			}
		}
		sent += n
	}
	replies := func(n int) {
		t.Helper()
		for range n {
			k, err := client.Read(buf)
			if err != nil {
				t.Fatalf("a reply missing: %v", err)
			}
			if got := new(dns.Msg); got.Unpack(buf[:k]) != nil || got.String() != want.String() {
				t.Errorf("reply %v, want\n%s", got, want)
			}
		}
	}
	// Each burst, in the socket before the read that takes it all, takes
	// the mean interval an eighth of the way to maxInterval/burst or
	// below, whatever the time between bursts: below the pause's
	// threshold, which the mean passes within a few dozen bursts.
	const burst = batchLen / 2
	for i := 0; ; i++ {
		if i == 64 {
			t.Fatalf("no pause after %d bursts of %d", i, burst)
		}
		send(burst)
		m := next()
		replies(burst)
		if m == pauseRead {
			break
		}
	}
	if m := next(); m != pauseRead {
		t.Fatalf("after a burst taken after a pause, the reader reads by %v, want %v", m, pauseRead)
	}
	// That pause finds nothing.
	if m := next(); m != waitRead {
		t.Fatalf("after a pause that found nothing, the reader reads by %v, want %v", m, waitRead)
	}
	time.Sleep(maxInterval) // an idle spell, which the mean counts as one of maxInterval
	send(1)
	replies(1)
	if m := next(); m != waitRead {
		t.Errorf("after a lone request, after an idle spell, the reader reads by %v, want %v", m, waitRead)
	}
	if hits := testutil.ToFloat64(fe.blocks[0].fm.Hit); hits != float64(sent) {
		t.Errorf("%v hits counted, want %d", hits, sent)
	}
	close(stop)
	s.shutdown()
	<-done
}

// TestRaiseProcs: readers leave a P for the rest of the server, GOMAXPROCS
// is never lowered, and the default number of sockets stays the CPUs the
// server was given, so that front ends started after a raise do not open
// more sockets, which would raise it again. It starts from no raise, which
// the tests before it may have made.
func TestRaiseProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	n, raised := readers.n, readers.procs
	readers.n, readers.procs = 0, 0
	defer func() { readers.n, readers.procs = n, raised }()
	for _, step := range []struct{ readers, procs int }{{2, 3}, {1, 4}, {-3, 4}, {2, 4}, {3, 6}} {
		raiseProcs(step.readers)
		if got := runtime.GOMAXPROCS(0); got != step.procs {
			t.Errorf("%d readers more: GOMAXPROCS %d, want %d", step.readers, got, step.procs)
		}
		if got := procs(); got != 1 {
			t.Errorf("%d readers more: the server's CPUs read as %d, want 1", step.readers, got)
		}
	}
	c := caddy.NewTestController("dns", "frontend 127.0.0.1:53")
	c.Next()
	if f, err := Parse(c, c.RemainingArgs()); err != nil || f.sockets != 1 {
		t.Errorf("after a raise, a front end has %d sockets (%v), want 1", f.sockets, err)
	}
}

// TestCloseOnce: a front end closed twice closes its sockets once; the
// second close, and a chain's reply written after the first, must not
// reach a file that took a socket's number since.
func TestCloseOnce(t *testing.T) {
	s, err := listenThread("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fe := &frontend{cfg: &Config{}, threads: []*threadSocket{s}}
	fd := s.fd
	fe.close()
	var reused *os.File
	for range 100 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if int(f.Fd()) == fd {
			reused = f
			break
		}
	}
	if reused == nil {
		t.Fatalf("no file took the socket's number %d", fd)
	}
	fe.close()
	if _, err := unix.FcntlInt(reused.Fd(), unix.F_GETFD, 0); err != nil {
		t.Errorf("the second close closed the file that took the socket's number: %v", err)
	}
	// A chain's reply that comes late must not go to that file either.
	if _, err := s.sendmsg([]byte("late"), nil, netip.MustParseAddrPort("127.0.0.1:53")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a reply after close: %v, want %v", err, net.ErrClosed)
	}
}

// TestClosedSendCountsTheBatch: when a batch's send fails as its socket
// closes (a thread socket shut down with its send buffer full, a poller
// socket closed), every request of the batch is counted, the replies not
// sent and the requests left unanswered as dropped. The requests after the
// failed run were counted nowhere.
func TestClosedSendCountsTheBatch(t *testing.T) {
	const requests = 8
	for _, tc := range []struct {
		name  string
		batch func(t *testing.T, b *udpBatch) *udpBatch
	}{
		{"thread", func(t *testing.T, b *udpBatch) *udpBatch {
			fd, _ := fullSocket(t)
			s := &threadSocket{fd: fd, local: b.local}
			s.closed.Store(true)
			return newThreadBatch(b.fe, s)
		}},
		{"poller", func(t *testing.T, b *udpBatch) *udpBatch {
			b.conn.Close()
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits, _ := hitBatch(t)
			pkt := slices.Clone(hits.bufs[0][:hits.in[0].Len])
			b := tc.batch(t, hits)
			for i := range requests {
				b.in[i].Len = uint32(copy(b.bufs[i][:], pkt))
				b.names[i].Family = unix.AF_INET
			}
			b.received = requests
			if err := b.answerAll(time.Now()); err == nil {
				t.Fatal("the batch was sent")
			}
			fm := b.fe.blocks[0].fm
			if hit, dropped := testutil.ToFloat64(fm.Hit), testutil.ToFloat64(fm.Dropped); hit != 0 || dropped != requests {
				t.Errorf("%v hits and %v dropped of %d requests, want all dropped", hit, dropped, requests)
			}
		})
	}
}

// TestDrainWaitsOutAFullBuffer: a drain of a thread socket, shut down as
// its front end closes, waits while the socket's send buffer is full, as
// its reader did before, and answers what waits there. It gave up at the
// first full buffer, and the requests still in the socket were lost,
// counted nowhere.
func TestDrainWaitsOutAFullBuffer(t *testing.T) {
	const requests = 8
	hits, _ := hitBatch(t)
	pkt := slices.Clone(hits.bufs[0][:hits.in[0].Len])
	fd, peer := fullSocket(t)
	s := &threadSocket{fd: fd, local: hits.local}
	s.closed.Store(true)
	b := newThreadBatch(hits.fe, s)
	b.draining = true // as drain has it: a TCP socket's reads are no datagrams
	for i := range requests {
		b.in[i].Len = uint32(copy(b.bufs[i][:], pkt))
		b.names[i].Family = unix.AF_INET
	}
	b.received = requests
	go io.Copy(io.Discard, peer)
	if err := b.answerAll(time.Now()); err != nil {
		t.Fatalf("the drain's batch: %v", err)
	}
	fm := b.fe.blocks[0].fm
	if hit, dropped := testutil.ToFloat64(fm.Hit), testutil.ToFloat64(fm.Dropped); hit != requests || dropped != 0 {
		t.Errorf("%v hits and %v dropped of %d requests, want all answered", hit, dropped, requests)
	}
}

// fullSocket returns a socket, connected, whose send buffer is full, and
// its peer, which reads nothing.
func fullSocket(t *testing.T) (int, *net.TCPConn) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	peer, err := net.DialTCP("tcp", nil, l.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	peer.SetReadBuffer(4096)
	conn, err := l.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	conn.SetWriteBuffer(4096)
	f, err := conn.File()
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd())
	chunk := make([]byte, 1<<16)
	for {
		if _, err := unix.SendmsgN(fd, chunk, nil, nil, unix.MSG_DONTWAIT); errors.Is(err, unix.EAGAIN) {
			return fd, peer
		} else if err != nil {
			t.Fatal(err)
		}
	}
}
