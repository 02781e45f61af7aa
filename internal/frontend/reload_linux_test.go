package frontend

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	golog "log"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gatedCache answers A requests, as a cache with an entry for each would,
// and hands the rest to the chain. The first request it is asked holds its
// reader until release closes.
type gatedCache struct {
	cannedCache
	asked, release chan struct{}
	once           sync.Once
}

func newGatedCache(t *testing.T) *gatedCache {
	reply, err := new(dns.Msg).SetQuestion("www.example.org.", dns.TypeA).Pack()
	if err != nil {
		t.Fatal(err)
	}
	reply[2] |= 0x80 // QR
	c := &gatedCache{cannedCache: cannedCache{reply: reply}, asked: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(c.open)
	return c
}

// open lets the held reader go, once.
func (c *gatedCache) open() {
	select {
	case <-c.release:
	default:
		close(c.release)
	}
}

// Answerer returns an Answerer with a reply of its own, as each reader has.
func (c *gatedCache) Answerer(string) Answerer {
	return gatedAnswerer{c, cannedAnswerer{reply: append([]byte(nil), c.reply...)}}
}

type gatedAnswerer struct {
	c *gatedCache
	cannedAnswerer
}

func (a gatedAnswerer) Answer(pkt []byte, client netip.Addr, tcp bool, now time.Time, hit *Hit) []byte {
	a.c.once.Do(func() {
		close(a.c.asked)
		<-a.c.release
	})
	if binary.BigEndian.Uint16(pkt[len(pkt)-4:]) != dns.TypeA {
		return nil
	}
	return a.cannedAnswerer.Answer(pkt, client, tcp, now, hit)
}

// chainServer returns a server whose chain answers every request with a
// TXT record that names it.
func chainServer(t *testing.T, name string) *dnsserver.Server {
	answer := plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		m := new(dns.Msg).SetReply(r)
		m.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{name}}}
		w.WriteMsg(m)
		return dns.RcodeSuccess, nil
	})
	cfg := &dnsserver.Config{Zone: ".", Plugin: []plugin.Plugin{func(plugin.Handler) plugin.Handler { return answer }}}
	srv, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// openFrontend opens the front end fc of one block, whose cache is c.
func openFrontend(t *testing.T, fc *Config, c Cache) *frontend {
	fe, err := fc.listen()
	if err != nil {
		t.Fatal(err)
	}
	fe.blocks = []*block{{cache: c, zones: [][]byte{{0}}}} // of ., chainServer's zone
	t.Cleanup(fe.close)
	return fe
}

// udpAddrs returns the local addresses of fe's UDP sockets.
func (fe *frontend) udpAddrs() []net.Addr {
	var addrs []net.Addr
	for _, conn := range fe.udp {
		addrs = append(addrs, conn.LocalAddr())
	}
	for _, s := range fe.threads {
		addrs = append(addrs, s.local)
	}
	return addrs
}

// closeHeld closes old as a reload does, while its reader is held by
// cache, and lets the reader go once old has told its readers to leave.
func closeHeld(t *testing.T, old *frontend, release func()) {
	closed := make(chan struct{})
	go func() {
		old.close()
		close(closed)
	}()
	for i := 0; !old.stopping.Load(); i++ {
		if i == 1000 {
			t.Fatal("the front end does not close")
		}
		time.Sleep(time.Millisecond)
	}
	release()
	<-closed
}

// query returns request i: an A request, which the cache answers, or for
// odd i an AAAA one, which goes to the chain.
func query(t *testing.T, i int) []byte {
	qtype := dns.TypeA
	if i%2 == 1 {
		qtype = dns.TypeAAAA
	}
	m := new(dns.Msg).SetQuestion("www.example.org.", qtype)
	m.Id = uint16(i + 1)
	pkt, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return pkt
}

// checkReply checks that reply answers request i, a miss by the chain of
// the server named chain.
func checkReply(t *testing.T, reply []byte, i int, chain string) {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		t.Errorf("reply to request %d: %v", i, err)
		return
	}
	if int(m.Id) != i+1 {
		t.Errorf("reply of ID %d to request %d", m.Id, i)
	}
	if i%2 == 0 {
		return
	}
	if len(m.Answer) != 1 || m.Answer[0].(*dns.TXT).Txt[0] != chain {
		t.Errorf("request %d, a miss, answered by %v, want the chain of the %s front end", i, m.Answer, chain)
	}
}

// TestReloadAnswersQueuedUDP: the requests that wait in an old front end's
// UDP socket when it closes at a reload, its reader gone, are answered:
// hits from the cache, misses through the chain of the front end that
// replaces it, once that starts, since the old chain's plugins stop with
// their instance. The socket closed with its queue, and they were lost; and
// so they still were where the reload dropped another of the front end's
// addresses, which no newer front end has.
func TestReloadAnswersQueuedUDP(t *testing.T) {
	for _, wait := range []string{"thread", "poller"} {
		for _, tc := range []struct{ listen, dial, dropped string }{
			{"127.0.0.1:0", "127.0.0.1", ""},
			// The unspecified address: the replies name their source.
			{"[::]:0", "127.0.0.1", ""},
			{"127.0.0.1:0", "127.0.0.1", "127.0.0.1:0"},
		} {
			name := wait + " " + tc.listen
			if tc.dropped != "" {
				name += " dropping " + tc.dropped
			}
			t.Run(name, func(t *testing.T) {
				testReloadAnswersQueuedUDP(t, wait == "poller", tc.listen, tc.dial, tc.dropped)
			})
		}
	}
}

// testReloadAnswersQueuedUDP reloads a front end on listen, and on dropped
// unless empty, as one on listen alone.
func testReloadAnswersQueuedUDP(t *testing.T, poller bool, listen, dial, dropped string) {
	cache := newGatedCache(t)
	fc := &Config{udp: []string{listen}, sockets: 1, inflight: 64, poller: poller}
	if dropped != "" {
		fc.udp = append(fc.udp, dropped)
	}
	old := openFrontend(t, fc, cache)
	old.start(chainServer(t, "old"))
	local := old.udpAddrs()[0].(*net.UDPAddr)
	client, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.ParseIP(dial), Port: local.Port})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// The first request holds the old front end's reader; the others wait
	// in its socket, its address's only one.
	const queued = 16
	for i := range queued {
		if _, err := client.Write(query(t, i)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			<-cache.asked
		}
	}
	next := openFrontend(t, &Config{udp: []string{local.String()}, sockets: 1, inflight: 64, poller: poller}, cache)
	closeHeld(t, old, cache.open)
	next.start(chainServer(t, "next"))

	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	got := map[int]bool{}
	for range queued {
		n, err := client.Read(buf)
		if err != nil {
			break
		}
		i := int(binary.BigEndian.Uint16(buf)) - 1
		checkReply(t, buf[:n], i, "next")
		got[i] = true
	}
	if len(got) != queued {
		t.Errorf("%d of %d requests that waited in the old front end's socket got a reply", len(got), queued)
	}
}

// heldListener holds its Accepts until release closes.
type heldListener struct {
	*net.TCPListener
	release chan struct{}
}

func (l heldListener) Accept() (net.Conn, error) {
	<-l.release
	return l.TCPListener.Accept()
}

// TestReloadServesQueuedTCP: the connections that wait in an old front
// end's TCP listener when it closes at a reload are served by the front end
// that replaces it, which answers their requests. The listener closed with
// its queue, and the kernel reset them.
func TestReloadServesQueuedTCP(t *testing.T) {
	cache := newGatedCache(t)
	cache.once.Do(func() {}) // only the accepts are held
	old := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 64}, cache)
	l := old.tcp[0].(*net.TCPListener)
	old.tcp[0] = heldListener{l, cache.release}
	old.start(chainServer(t, "old"))

	// The connections wait in the old listener, its address's only one.
	const queued = 8
	var conns []net.Conn
	for i := range queued {
		conn := dialTCP(t, l.Addr().String())
		writeRequest(t, conn, query(t, i))
		conns = append(conns, conn)
	}
	next := openFrontend(t, &Config{tcp: []string{l.Addr().String()}, inflight: 64}, cache)
	closeHeld(t, old, cache.open)
	next.start(chainServer(t, "next"))

	answered := 0
	for i, conn := range conns {
		reply, err := readReply(conn)
		if err != nil {
			continue
		}
		checkReply(t, reply, i, "next")
		answered++
	}
	if answered != queued {
		t.Errorf("%d of %d connections that waited in the old front end's listener were answered", answered, queued)
	}
}

// TestReloadKeepsTCPConnections: the connections an old front end serves
// when it closes at a reload go on to the front end that replaces it, with
// the requests their clients sent that it did not read: one whose reader
// answers a request, with more requests behind it, and one whose reader
// waits for a request. The old front end closed them, and those requests
// were lost.
func TestReloadKeepsTCPConnections(t *testing.T) {
	cache := newGatedCache(t)
	old := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 64}, cache)
	old.start(chainServer(t, "old"))
	addr := old.tcp[0].Addr().String()
	send := func(conn net.Conn, from, to int) {
		for i := from; i < to; i++ {
			writeRequest(t, conn, query(t, i))
		}
	}
	// The first request holds busy's reader; the others wait behind it,
	// the second read with the first, as the two came in one write.
	busy := dialTCP(t, addr)
	if _, err := busy.Write(framed(query(t, 0), query(t, 1))); err != nil {
		t.Fatal(err)
	}
	<-cache.asked
	send(busy, 2, 8)
	idle := dialTCP(t, addr)
	for i := 0; ; i++ {
		old.conns.mu.Lock()
		n := len(old.conns.m)
		old.conns.mu.Unlock()
		if n == 2 {
			break
		}
		if i == 1000 {
			t.Fatal("the idle connection was not accepted")
		}
		time.Sleep(time.Millisecond)
	}
	next := openFrontend(t, &Config{tcp: []string{addr}, inflight: 64}, cache)
	closeHeld(t, old, cache.open)
	send(idle, 8, 12)
	next.start(chainServer(t, "next"))

	for _, tc := range []struct {
		name     string
		conn     net.Conn
		from, to int
	}{
		{"busy", busy, 0, 8},
		{"idle", idle, 8, 12},
	} {
		answered := 0
		for i := tc.from; i < tc.to; i++ {
			reply, err := readReply(tc.conn)
			if err != nil {
				break
			}
			checkReply(t, reply, i, "next")
			answered++
		}
		if answered != tc.to-tc.from {
			t.Errorf("%s connection: %d of %d requests answered", tc.name, answered, tc.to-tc.from)
		}
	}
}

// writeRequest writes pkt on conn with its two-byte length.
func writeRequest(t *testing.T, conn net.Conn, pkt []byte) {
	t.Helper()
	if _, err := conn.Write(framed(pkt)); err != nil {
		t.Fatal(err)
	}
}

// framed returns msgs, each after its two-byte length, back to back.
func framed(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

// dialTCP connects to addr, until the test ends.
func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dialAnswered connects to addr, until the test ends, and has the front
// end there answer a hit on the connection: a connection that has served a
// query and waits for its next.
func dialAnswered(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn := dialTCP(t, addr)
	writeRequest(t, conn, query(t, 0))
	if _, err := readReply(conn); err != nil {
		t.Fatalf("a new connection's first query: %v", err)
	}
	return conn
}

// startTCP opens and starts a front end of one TCP listener on a port of
// its own, of inflight, whose cache holds no reader, with srv.
func startTCP(t *testing.T, inflight int, srv *dnsserver.Server) *frontend {
	t.Helper()
	cache := newGatedCache(t)
	cache.once.Do(func() {}) // nothing held
	fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: inflight}, cache)
	fe.start(srv)
	return fe
}

// reloadTCP reloads old, a front end of one TCP listener, as a new
// instance does: it opens the next front end on old's address, of old's
// inflight and cache, closes old, which hands its connections over, and
// starts the next with srv.
func reloadTCP(t *testing.T, old *frontend, srv *dnsserver.Server) *frontend {
	t.Helper()
	next := openFrontend(t, &Config{tcp: []string{old.tcp[0].Addr().String()}, inflight: old.cfg.inflight}, old.blocks[0].cache)
	old.close()
	next.start(srv)
	return next
}

// readReply reads a message off conn, waiting 5 s at most.
func readReply(conn net.Conn) ([]byte, error) {
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var size [2]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return nil, err
	}
	reply := make([]byte, binary.BigEndian.Uint16(size[:]))
	_, err := io.ReadFull(conn, reply)
	return reply, err
}

// waitWaiting waits for fe's reader of n connections to wait for a request.
func waitWaiting(t *testing.T, fe *frontend, n int) {
	t.Helper()
	waitState(t, fe, waiting, n)
}

// waitState waits for fe's readers of n connections to be at state.
func waitState(t *testing.T, fe *frontend, state connState, n int) {
	t.Helper()
	for i := 0; ; i++ {
		fe.conns.mu.Lock()
		at := 0
		for _, s := range fe.conns.m {
			if s == state {
				at++
			}
		}
		fe.conns.mu.Unlock()
		if at == n {
			return
		}
		if i == 1000 {
			t.Fatalf("%d connections at %d, want %d", at, state, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReloadKeepsTCPQueryCount: a connection handed over at a reload has
// served the queries its old front end answered: the server's most queries
// per connection (maxtcpqueries) counts them, and the new front end closes
// it once it has served the rest. The count started again at each front
// end, and reloads let a connection serve without end.
func TestReloadKeepsTCPQueryCount(t *testing.T) {
	srv := chainServer(t, "old")
	srv.MaxTCPQueries = 2
	old := startTCP(t, 64, srv)
	conn := dialAnswered(t, old.tcp[0].Addr().String())
	waitWaiting(t, old, 1)

	srv = chainServer(t, "next")
	srv.MaxTCPQueries = 2
	reloadTCP(t, old, srv)
	writeRequest(t, conn, query(t, 2))
	writeRequest(t, conn, query(t, 4))
	if _, err := readReply(conn); err != nil {
		t.Fatalf("the second query: %v", err)
	}
	if _, err := readReply(conn); err == nil {
		t.Error("a third query answered on a connection of at most 2")
	}
}

// TestReloadHandedTCPTakesASlot: a connection handed over at a reload is
// one of the new front end's open connections on its address, which
// inflight limits: past it a new connection takes its place, and it is
// closed. Handed connections were not counted, and reloads let the open
// connections grow without bound.
func TestReloadHandedTCPTakesASlot(t *testing.T) {
	old := startTCP(t, 1, chainServer(t, "old"))
	addr := old.tcp[0].Addr().String()
	handed := dialTCP(t, addr)
	waitWaiting(t, old, 1)

	reloadTCP(t, old, chainServer(t, "next"))
	writeRequest(t, handed, query(t, 0))
	if _, err := readReply(handed); err != nil {
		t.Fatalf("the handed connection: %v", err)
	}
	conn := dialTCP(t, addr)
	writeRequest(t, conn, query(t, 2))
	if _, err := readReply(conn); err != nil {
		t.Fatalf("the second connection: %v", err)
	}
	if _, err := readReply(handed); !errors.Is(err, io.EOF) {
		t.Errorf("the handed connection: %v, want it closed for the second of a front end of inflight 1", err)
	}
}

// TestFailedReloadServesQueuedTCP: when a reload fails, the new instance's
// front end, which opened its listener beside the running one's and never
// started, closes, and the connections that wait in its listener's queue
// go to the running front end, which serves them. The kernel reset them.
func TestFailedReloadServesQueuedTCP(t *testing.T) {
	running := startTCP(t, 64, chainServer(t, "running"))
	addr := running.tcp[0].Addr().String()
	failed := openFrontend(t, &Config{tcp: []string{addr}, inflight: 64}, running.blocks[0].cache)

	// SO_REUSEPORT spreads the connections over both listeners.
	const n = 16
	var conns []net.Conn
	for i := range n {
		conn := dialTCP(t, addr)
		writeRequest(t, conn, query(t, 2*i+1))
		conns = append(conns, conn)
	}
	failed.close()
	answered := 0
	for i, conn := range conns {
		reply, err := readReply(conn)
		if err != nil {
			continue
		}
		checkReply(t, reply, 2*i+1, "running")
		answered++
	}
	if answered != n {
		t.Errorf("%d of %d connections answered", answered, n)
	}
}

// TestFailedReloadAnswersQueuedUDP: when a reload fails, the requests that
// wait in the UDP sockets of the new instance's front end, which opened
// them beside the running one's and never started, are answered by the
// running front end: hits from its cache, misses through its chain. They
// were lost with the sockets.
func TestFailedReloadAnswersQueuedUDP(t *testing.T) {
	for _, wait := range []string{"thread", "poller"} {
		t.Run(wait, func(t *testing.T) {
			poller := wait == "poller"
			cache := newGatedCache(t)
			cache.once.Do(func() {}) // nothing held
			running := openFrontend(t, &Config{udp: []string{"127.0.0.1:0"}, sockets: 1, inflight: 64, poller: poller}, cache)
			running.start(chainServer(t, "running"))
			local := running.udpAddrs()[0].(*net.UDPAddr)
			failed := openFrontend(t, &Config{udp: []string{local.String()}, sockets: 1, inflight: 64, poller: poller}, cache)

			// SO_REUSEPORT spreads the clients over both sockets.
			const n = 16
			var clients []*net.UDPConn
			for i := range n {
				client, err := net.DialUDP("udp", nil, local)
				if err != nil {
					t.Fatal(err)
				}
				defer client.Close()
				if _, err := client.Write(query(t, i)); err != nil {
					t.Fatal(err)
				}
				clients = append(clients, client)
			}
			failed.close()
			answered := 0
			buf := make([]byte, 512)
			for i, client := range clients {
				client.SetReadDeadline(time.Now().Add(5 * time.Second))
				m, err := client.Read(buf)
				if err != nil {
					continue
				}
				checkReply(t, buf[:m], i, "running")
				answered++
			}
			if answered != n {
				t.Errorf("%d of %d requests answered", answered, n)
			}
		})
	}
}

// TestSampledLogCountsTCPHits: `log N` logs one hit in N of the TCP
// connections' hits together, as of a socket's: connections of fewer than
// N hits, as most are, had none of theirs logged.
func TestSampledLogCountsTCPHits(t *testing.T) {
	var logs testenv.LogBuffer
	prev := golog.Writer()
	golog.SetOutput(&logs)
	defer golog.SetOutput(prev)
	cache := newGatedCache(t)
	cache.once.Do(func() {}) // nothing held
	fe := openFrontend(t, &Config{tcp: []string{"127.0.0.1:0"}, inflight: 64, logEvery: 2}, cache)
	fe.start(chainServer(t, "fe"))
	for i := range 4 {
		conn, err := net.Dial("tcp", fe.tcp[0].Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		writeRequest(t, conn, query(t, 2*i))
		if _, err := readReply(conn); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	// A hit is logged once its reply is sent: wait for the last one's line.
	n := 0
	for i := 0; i < 200 && n < 2; i++ {
		time.Sleep(10 * time.Millisecond)
		n = strings.Count(logs.String(), "front end hit")
	}
	if n != 2 {
		t.Errorf("%d of 4 hits over TCP logged with log 2, want 2:\n%s", n, logs.String())
	}
}

// TestReloadKeepsTCPIdleTimeout: a connection handed over at a reload after
// it served a query waits for its next for the idle timeout, as between
// any two queries, not for the read timeout of a connection's first.
func TestReloadKeepsTCPIdleTimeout(t *testing.T) {
	server := func(name string) *dnsserver.Server {
		srv := chainServer(t, name)
		srv.ReadTimeout, srv.IdleTimeout = 50*time.Millisecond, time.Minute
		return srv
	}
	old := startTCP(t, 64, server("old"))
	conn := dialAnswered(t, old.tcp[0].Addr().String())
	waitWaiting(t, old, 1)

	reloadTCP(t, old, server("next"))
	time.Sleep(200 * time.Millisecond) // past the read timeout, within the idle one
	writeRequest(t, conn, query(t, 1))
	if reply, err := readReply(conn); err != nil {
		t.Errorf("the second query: %v", err)
	} else {
		checkReply(t, reply, 1, "next")
	}
}

// TestReloadKeepsTCPIdleDeadline: a connection handed over at reloads
// closes once it has been idle for the idle timeout, counted from its last
// reply whatever front end it is with. Each hand-over waited the whole
// idle timeout again, and reloads more often than that kept an idle
// connection open for good.
func TestReloadKeepsTCPIdleDeadline(t *testing.T) {
	const idle = 300 * time.Millisecond
	server := func() *dnsserver.Server {
		srv := chainServer(t, "chain")
		srv.ReadTimeout, srv.IdleTimeout = idle, idle
		return srv
	}
	fe := startTCP(t, 64, server())
	conn := dialAnswered(t, fe.tcp[0].Addr().String())
	// Reloads every third of the idle timeout, for five times it.
	for range 15 {
		time.Sleep(idle / 3)
		fe = reloadTCP(t, fe, server())
	}
	// Closed long ago: the read ends at once, not a timeout after the
	// last reload.
	conn.SetReadDeadline(time.Now().Add(idle / 3))
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a connection idle for five idle timeouts across reloads: read %d bytes, %v; want it closed", n, err)
	}
}

// TestHandedToClosedIsCounted: a miss an old front end handed at a reload
// to the new one, which then closes without having started (its server not
// found), is counted as dropped: every request the front ends read is
// counted once. It was counted nowhere.
func TestHandedToClosedIsCounted(t *testing.T) {
	cache := newGatedCache(t)
	old := openFrontend(t, &Config{udp: []string{"127.0.0.1:0"}, sockets: 1, inflight: 64}, cache)
	old.start(chainServer(t, "old"))
	local := old.udpAddrs()[0].(*net.UDPAddr)
	client, err := net.DialUDP("udp", nil, local)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// The hit holds the reader; the miss waits in the socket.
	for i := range 2 {
		if _, err := client.Write(query(t, i)); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			<-cache.asked
		}
	}
	next := openFrontend(t, &Config{udp: []string{local.String()}, sockets: 1, inflight: 64}, cache)
	closeHeld(t, old, cache.open)
	next.close()
	var counted float64
	for i := 0; i < 200 && counted < 2; i++ {
		fm := old.blocks[0].fm
		counted = testutil.ToFloat64(fm.Hit) + testutil.ToFloat64(fm.Chain) + testutil.ToFloat64(fm.Shed) + testutil.ToFloat64(fm.Dropped)
		time.Sleep(10 * time.Millisecond)
	}
	if counted != 2 {
		t.Errorf("%v of 2 requests counted", counted)
	}
}
