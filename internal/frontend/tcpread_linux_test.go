package frontend

import (
	"net"
	"sync/atomic"
	"syscall"
	"testing"
)

// countingListener accepts connections that count their reads.
type countingListener struct {
	*net.TCPListener
	reads *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	conn, err := l.TCPListener.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return countingConn{conn, l.reads}, nil
}

// countingConn counts the reads made of it: its Reads, and the calls of
// what its RawConn's Read is given, each a system call.
type countingConn struct {
	*net.TCPConn
	reads *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	c.reads.Add(1)
	return n, err
}

func (c countingConn) SyscallConn() (syscall.RawConn, error) {
	raw, err := c.TCPConn.SyscallConn()
	return countingRaw{raw, c.reads}, err
}

type countingRaw struct {
	syscall.RawConn
	reads *atomic.Int64
}

func (r countingRaw) Read(f func(fd uintptr) bool) error {
	return r.RawConn.Read(func(fd uintptr) bool {
		r.reads.Add(1)
		return f(fd)
	})
}

// TestTCPReadsOncePerRequest: a request its client wrote whole, its length
// and message together, costs the connection's reader one read, hit or
// miss. It cost three: a peek (MSG_PEEK) that waited for the request
// without taking it, then the reads of its length and of its message.
func TestTCPReadsOncePerRequest(t *testing.T) {
	cache := newGatedCache(t)
	cache.once.Do(func() {}) // nothing held
	fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 64}, cache)
	var reads atomic.Int64
	fe.tcp[0] = countingListener{fe.tcp[0].(*net.TCPListener), &reads}
	fe.start(chainServer(t, "fe"))
	conn := dialTCP(t, fe.tcp[0].Addr().String())
	const requests = 8
	for i := range requests {
		writeRequest(t, conn, query(t, i))
		reply, err := readReply(conn)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		checkReply(t, reply, i, "fe")
	}
	// The read of the next request, under way, has not returned.
	if n := reads.Load(); n != requests {
		t.Errorf("%d reads for %d requests, want one each", n, requests)
	}
}
