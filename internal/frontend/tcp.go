package frontend

import (
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/core/dnsserver"

	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// TCP clients of the front end are mostly UDP clients retrying a truncated
// answer, so TCP is served plainly: a goroutine per connection, requests
// answered in order, hits from the cache and the rest through the chain.

// serveTCP accepts connections on l until it is closed.
func (fe *frontend) serveTCP(l net.Listener) {
	for {
		conn, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || fe.stopping.Load() {
				return
			}
			log.Warningf("frontend: accepting on %s: %v", l.Addr(), err)
			time.Sleep(10 * time.Millisecond) // out of descriptors: let some close
			continue
		}
		fe.goServe(conn, l.Addr(), session{waiting: time.Now()})
	}
}

// session is what a connection carries from front end to front end at a
// reload, so that the server's limits hold across reloads: the queries it
// has served, and since when it waits for the next; and its reader, with
// what its client sent that was read and not yet served, and the buffer
// of the typical size its requests are read into.
type session struct {
	queries int
	waiting time.Time
	in      *bufio.Reader // nil until the connection is first served
	pkt     []byte
}

// tcpReadLen is the room a connection's reader reads into: a request of a
// datagram's size with its length, or a few pipelined ones, in one read.
// A longer request takes more reads.
const tcpReadLen = 2 + 512

// goServe serves conn, accepted on the listener at local, from where its
// session is, in a goroutine of its own, unless the front end closes. At
// most inflight connections are open on local at a time, those handed
// over at a reload among them: past that conn takes the place of one that
// waits for a request or reads one (evict), as RFC 7766 (section 10) lets
// a server close connections at its limit, and is closed when there is
// none, all new themselves.
func (fe *frontend) goServe(conn net.Conn, local net.Addr, s session) {
	if !fe.conns.add(conn) {
		fe.handConn(conn, local, s) // the front end closes
		return
	}
	open := fe.tcpOpen[socketKey(local)]
	evicted := false
	select {
	case open <- struct{}{}:
	default:
		if evicted = fe.conns.evict(); !evicted {
			fe.conns.remove(conn)
			conn.Close() // not shed: no request was read
			return
		}
	}
	go func() {
		if evicted {
			open <- struct{}{} // the evicted connection's, once it closes
		}
		closing, s := fe.serveConn(conn, s)
		fe.conns.remove(conn)
		<-open
		if closing {
			fe.handConn(conn, local, s)
		} else {
			conn.Close()
		}
	}()
}

// handConn hands conn, accepted on the listener at local and left between
// requests, to the newest front end on local, which serves it once it
// starts, from where its session is (the requests read and not served
// among it); or, with none newer, to a running one on local, which a
// failed reload leaves the older; it closes conn when there is neither. So
// a reload closes no connection: one closed would lose the requests its
// client had sent that the closing front end did not serve.
func (fe *frontend) handConn(conn net.Conn, local net.Addr, s session) {
	served := fe.handOver(local, func(next *frontend) {
		if next == nil {
			conn.Close()
			return
		}
		next.goServe(conn, local, s)
	})
	if served {
		return
	}
	if o := running(fe, local); o != nil {
		o.goServe(conn, local, s)
		return
	}
	conn.Close()
}

// stopAccepting ends l's Accept, which serveTCP waits in, and leaves l open:
// the connections that wait in its queue are accepted and handed over
// before it closes (closeListener).
func stopAccepting(l net.Listener) {
	if d, ok := l.(interface{ SetDeadline(time.Time) error }); !ok || d.SetDeadline(aLongTimeAgo) != nil {
		l.Close()
	}
}

// closeListener closes l, a listener that no longer accepts, once it has
// handed the connections waiting in its queue, which closing it would
// reset, to the newest front end on its address, which serves them once it
// starts.
func (fe *frontend) closeListener(l net.Listener) {
	for _, conn := range queued(l, fe.cfg.inflight) {
		fe.handConn(conn, l.Addr(), session{waiting: time.Now()})
	}
	l.Close()
}

// serveConn answers the requests of one connection, from where its session
// is, until the client closes it or leaves it idle, or it has served the
// server's most queries, or a write fails, or a new connection takes its
// place past inflight (evict), or the front end closes: true then, and the
// next request is left to the session's reader, unserved. It returns the
// session where it is.
func (fe *frontend) serveConn(conn net.Conn, s session) (closing bool, _ session) {
	t := &tcpConn{conn: conn, timeout: fe.limits.write}
	if s.in == nil {
		s.in = bufio.NewReaderSize(conn, tcpReadLen)
		s.pkt = make([]byte, dnsmsg.TypicalLen)
	}
	client := conn.RemoteAddr().(*net.TCPAddr).AddrPort()
	local := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	as, r, timed := fe.answerers(), fe.newReader(), fe.timed()
	var hit Hit
	var size [2]byte
	for ; s.queries < fe.limits.queries || fe.limits.queries < 0; s.queries, s.waiting = s.queries+1, time.Now() {
		// The first read waits for the read timeout, the next ones for the
		// idle timeout, as miekg/dns's server reads.
		timeout := fe.limits.idle
		if s.queries == 0 {
			timeout = fe.limits.read
		}
		if o := fe.conns.wait(conn, s.waiting.Add(timeout)); o != goOn {
			return o == handOn, s
		}
		// What the client sent, the request whole as a rule, comes in one
		// read, or was read with the one before. A reader that leaves as
		// its front end closes hands it on with the connection (session).
		_, err := s.in.Peek(1)
		if o := fe.conns.reading(conn); o != goOn {
			return o == handOn, s
		}
		if err != nil {
			return false, s
		}
		if _, err := io.ReadFull(s.in, size[:]); err != nil {
			return false, s
		}
		n := int(binary.BigEndian.Uint16(size[:]))
		pkt := s.pkt
		if n > len(pkt) {
			// A buffer of its own, dropped once answered: between
			// requests a connection holds the typical size, whatever
			// it was once sent.
			pkt = make([]byte, n)
		}
		if _, err := io.ReadFull(s.in, pkt[:n]); err != nil {
			return false, s
		}
		start := time.Now()
		if reply, block := fe.answer(as, pkt[:n], client.Addr(), true, start, &hit); reply != nil {
			_, err := t.write(reply)
			var took time.Duration
			if timed {
				took = time.Since(start)
			}
			fe.account(r, block, pkt[:n], reply, local, client, true, err == nil, &hit, took)
			if err != nil {
				return false, s
			}
			continue
		}
		fe.serveChain(pkt[:n], &chainWriter{local: conn.LocalAddr(), remote: conn.RemoteAddr(), tcp: t})
		if t.failed() {
			return false, s
		}
	}
	return false, s
}

// tcpLimits are what the server's own TCP listener allows a connection,
// which the block's timeouts plugin sets.
type tcpLimits struct {
	read, idle time.Duration // before the first request, and between requests
	write      time.Duration // for a reply to be sent
	queries    int           // on one connection; -1 for no limit
}

// limitsOf returns srv's TCP limits, with miekg/dns's defaults where srv
// leaves them unset, as its listener has them.
func limitsOf(srv *dnsserver.Server) tcpLimits {
	l := tcpLimits{read: srv.ReadTimeout, idle: srv.IdleTimeout, write: srv.WriteTimeout, queries: srv.MaxTCPQueries}
	if l.read <= 0 {
		l.read = 2 * time.Second
	}
	if l.idle <= 0 {
		l.idle = 8 * time.Second
	}
	if l.write <= 0 {
		l.write = 2 * time.Second
	}
	if l.queries == 0 {
		l.queries = 128
	}
	return l
}

// tcpConn writes messages with their two-byte length (RFC 1035 4.2.2),
// each within the server's write timeout: a client that reads no replies
// would otherwise hold its reader, and one of inflight's slots, for good.
type tcpConn struct {
	mu      sync.Mutex // a plugin may write from a goroutine of its own
	conn    net.Conn
	timeout time.Duration
	err     error // of a write that failed, perhaps part written: the stream is lost
}

func (t *tcpConn) write(msg []byte) (int, error) {
	if len(msg) > 0xFFFF {
		return 0, errors.New("message too long for TCP")
	}
	var size [2]byte
	binary.BigEndian.PutUint16(size[:], uint16(len(msg)))
	bufs := net.Buffers{size[:], msg}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return 0, t.err
	}
	t.conn.SetWriteDeadline(time.Now().Add(t.timeout))
	if _, t.err = bufs.WriteTo(t.conn); t.err != nil {
		return 0, t.err
	}
	return len(msg), nil
}

// failed reports whether a write failed, after which the connection is
// closed rather than another request read.
func (t *tcpConn) failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err != nil
}

// conns are the TCP connections a front end serves. When it closes, a
// reader waiting for a request leaves at once, and one answering a request
// once its reply is written, as miekg/dns's server has its connections'
// readers leave when it stops, rather than have the closed instance's chain
// answer for as long as the client keeps the connection; the connection
// goes on to the newer front end (handConn).
type conns struct {
	mu      sync.Mutex
	m       map[net.Conn]connState
	closing bool
	readers busy
}

// connState is where a connection's reader is.
type connState uint8

const (
	starting connState = iota // to wait for its first request, or for its slot (goServe)
	waiting                   // for a request
	reading                   // a request, and answering it
	evicted                   // its reader leaves, closing it, past inflight
)

// aLongTimeAgo is a read deadline that ends a read at once.
var aLongTimeAgo = time.Unix(1, 0)

// add counts conn's reader, unless the front end closes: false then.
func (c *conns) add(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return false
	}
	if c.m == nil {
		c.m = map[net.Conn]connState{}
	}
	c.m[conn] = starting
	c.readers.add()
	return true
}

// remove is the last act of conn's reader.
func (c *conns) remove(conn net.Conn) {
	c.mu.Lock()
	delete(c.m, conn)
	c.mu.Unlock()
	c.readers.done()
}

// outcome is what conn's reader does as it starts to wait for a request or
// to read one.
type outcome uint8

const (
	goOn   outcome = iota // it waits, or reads
	handOn                // it leaves, the front end closing: conn goes on to a newer one (handConn)
	leave                 // it leaves, conn evicted past inflight: conn closes
)

// wait has conn's reader wait for a request until deadline, unless it
// leaves. A deadline set after close's or evict's would undo it.
func (c *conns) wait(conn net.Conn, deadline time.Time) outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.move(conn, waiting)
	if o == goOn {
		conn.SetReadDeadline(deadline)
	}
	return o
}

// reading has conn's reader, whose wait ended, read the request that came,
// unless it leaves: what came of it then goes on with conn, unserved, or is
// lost with it.
func (c *conns) reading(conn net.Conn) outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.move(conn, reading)
}

// move has conn's reader go to state, unless it leaves; c.mu is held. A
// front end that closes hands conn on even when it was evicted.
func (c *conns) move(conn net.Conn, state connState) outcome {
	if c.closing {
		return handOn
	}
	if c.m[conn] == evicted {
		return leave
	}
	c.m[conn] = state
	return goOn
}

// evict has the reader of a connection that waits for a request, or else
// of one that reads one (or answers it, once its reply is written), leave
// and close it, and reports whether there was one. A wait ends at once, as
// does a read of a request that did not come whole.
func (c *conns) evict() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var victim net.Conn
	for conn, state := range c.m {
		if state == waiting {
			victim = conn
			break
		}
		if state == reading && victim == nil {
			victim = conn
		}
	}
	if victim == nil {
		return false
	}
	c.m[victim] = evicted
	victim.SetReadDeadline(aLongTimeAgo)
	return true
}

// close has the readers leave: a wait for a request ends at once, and no
// other starts. A request being read is read whole, and answered.
func (c *conns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	for conn, state := range c.m {
		if state == waiting {
			conn.SetReadDeadline(aLongTimeAgo)
		}
	}
}

// closeAll closes the connections whose readers are still there: a reply
// that did not come within the grace time, or a client that does not read
// it.
func (c *conns) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for conn := range c.m {
		conn.Close()
	}
}
