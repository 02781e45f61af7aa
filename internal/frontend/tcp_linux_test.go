package frontend

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTCPPastInflightNotShed: a connection closed past inflight open
// connections, before a byte of a request is read, is no request the
// front end read, and shed (requests answered SERVFAIL past inflight) does
// not count it. It did, in the first block's series.
func TestTCPPastInflightNotShed(t *testing.T) {
	cache := newGatedCache(t)
	fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 1}, cache)
	fe.start(chainServer(t, "fe"))
	addr := fe.tcp[0].Addr().String()
	// The first connection's request is held, and the second takes its
	// place once it is answered: none is left for a third.
	writeRequest(t, dialTCP(t, addr), query(t, 0))
	<-cache.asked
	dialTCP(t, addr)
	waitState(t, fe, evicted, 1)
	if _, err := readReply(dialTCP(t, addr)); err == nil {
		t.Fatal("a third connection answered by a front end of inflight 1")
	}
	if got := testutil.ToFloat64(fe.blocks[0].fm.Shed); got != 0 {
		t.Errorf("shed %v after a connection closed past inflight, want 0", got)
	}
}

// TestTCPPastInflightEvicts: past inflight open connections, a new one
// takes the place of one that waits for a request, or reads one, or once
// its reply is written of one that answers one; that one is closed. The
// new one was closed, and inflight idle connections, or ones that sent a
// byte, renewed at each timeout, kept every other client out, where
// CoreDNS's own server, with no such limit, serves them.
func TestTCPPastInflightEvicts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, fe *frontend, conn net.Conn, cache *gatedCache) // gets conn where it is evicted
		held  bool                                                               // its request answered before it closes
	}{
		{"idle", func(t *testing.T, fe *frontend, _ net.Conn, cache *gatedCache) {
			cache.once.Do(func() {})
			waitWaiting(t, fe, 1)
		}, false},
		{"half a length", func(t *testing.T, fe *frontend, conn net.Conn, cache *gatedCache) {
			cache.once.Do(func() {})
			if _, err := conn.Write([]byte{0}); err != nil {
				t.Fatal(err)
			}
			waitState(t, fe, reading, 1)
		}, false},
		{"answering", func(t *testing.T, _ *frontend, conn net.Conn, cache *gatedCache) {
			writeRequest(t, conn, query(t, 0))
			<-cache.asked
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := newGatedCache(t)
			fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 1}, cache)
			fe.start(chainServer(t, "fe"))
			addr := fe.tcp[0].Addr().String()
			first := dialTCP(t, addr)
			tc.start(t, fe, first, cache)
			next := dialTCP(t, addr)
			writeRequest(t, next, query(t, 2))
			if tc.held {
				waitState(t, fe, evicted, 1)
				cache.open()
				if _, err := readReply(first); err != nil {
					t.Errorf("the reply under way: %v", err)
				}
			}
			if reply, err := readReply(next); err != nil {
				t.Errorf("the next connection: %v", err)
			} else {
				checkReply(t, reply, 2, "fe")
			}
			if _, err := readReply(first); !errors.Is(err, io.EOF) {
				t.Errorf("the first connection: %v, want it closed", err)
			}
		})
	}
}

// smallSendListener accepts connections whose send buffer is the least the
// kernel allows, so that a client that reads no replies fills it soon.
type smallSendListener struct{ *net.TCPListener }

func (l smallSendListener) Accept() (net.Conn, error) {
	conn, err := l.TCPListener.AcceptTCP()
	if err == nil {
		conn.SetWriteBuffer(1)
	}
	return conn, err
}

// TestTCPClientReadingNoReplies: a client that sends requests and reads no
// replies, hits or misses, is closed once a reply waits the server's write
// timeout to be sent, and its slot goes to the next connection. Its reader
// waited in the write for good, holding one of inflight's slots; a miss's
// failed write was followed by the next request's, each waiting the whole
// timeout.
func TestTCPClientReadingNoReplies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first int // the requests: a hit for even, a miss for odd (query)
	}{
		{"hits", 0},
		{"misses", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := newGatedCache(t)
			cache.once.Do(func() {}) // nothing held
			fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 1}, cache)
			fe.tcp[0] = smallSendListener{fe.tcp[0].(*net.TCPListener)}
			srv := chainServer(t, "fe")
			srv.WriteTimeout = 50 * time.Millisecond
			fe.start(srv)
			addr := fe.tcp[0].Addr().String()
			stuck := dialTCP(t, addr)
			stuck.(*net.TCPConn).SetReadBuffer(1)
			var reqs [][]byte
			for i := range 1000 {
				reqs = append(reqs, query(t, tc.first+2*i))
			}
			go stuck.Write(framed(reqs...)) // fails once the front end closes it
			open := fe.tcpOpen[socketKey(fe.tcp[0].Addr())]
			for i := 0; len(open) > 0; i++ {
				if i == 500 {
					t.Fatal("the connection of a client reading no replies still open")
				}
				time.Sleep(10 * time.Millisecond)
			}
			dialAnswered(t, addr)
		})
	}
}

// TestTCPBufferAfterLongRequest: a connection sent a request longer than
// the typical size, then short ones, answers them all and keeps a buffer
// of the typical size. It kept one of its longest request's size while it
// was open, up to 64 KiB for each of inflight's connections.
func TestTCPBufferAfterLongRequest(t *testing.T) {
	fe := startTCP(t, 64, chainServer(t, "fe"))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client := dialTCP(t, l.Addr().String())
	conn, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	long := new(dns.Msg).SetQuestion("www.example.org.", dns.TypeAAAA)
	long.Id = 2 // request 1, a miss (query)
	long.SetEdns0(dns.DefaultMsgSize, false)
	opt := long.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_PADDING{Padding: make([]byte, 2*dnsmsg.TypicalLen)})
	pkt, err := long.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write(framed(pkt, query(t, 2), query(t, 3))); err != nil {
		t.Fatal(err)
	}
	client.(*net.TCPConn).CloseWrite()
	fe.conns.add(conn)
	_, s := fe.serveConn(conn, session{waiting: time.Now()})
	fe.conns.remove(conn)
	for i := 1; i <= 3; i++ {
		reply, err := readReply(client)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		checkReply(t, reply, i, "fe")
	}
	if cap(s.pkt) != dnsmsg.TypicalLen {
		t.Errorf("a buffer of %d bytes after the short requests, want %d", cap(s.pkt), dnsmsg.TypicalLen)
	}
}
