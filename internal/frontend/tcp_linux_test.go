package frontend

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTCPPastInflightNotShed: a connection closed past inflight open
// connections, before a byte of a request is read, is no request the
// front end read, and shed (requests answered SERVFAIL past inflight) does
// not count it. It did, in the first block's series.
func TestTCPPastInflightNotShed(t *testing.T) {
	cache := newGatedCache(t)
	cache.once.Do(func() {}) // nothing held
	fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 1}, cache)
	fe.start(chainServer(t, "fe"))
	addr := fe.tcp[0].Addr().String()
	dialTCP(t, addr)
	waitWaiting(t, fe, 1)
	if _, err := readReply(dialTCP(t, addr)); err == nil {
		t.Fatal("a second connection answered by a front end of inflight 1")
	}
	if got := testutil.ToFloat64(fe.blocks[0].fm.Shed); got != 0 {
		t.Errorf("shed %v after a connection closed past inflight, want 0", got)
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
			conn := dialTCP(t, addr)
			writeRequest(t, conn, query(t, 0))
			if _, err := readReply(conn); err != nil {
				t.Errorf("the next connection: %v", err)
			}
		})
	}
}
