// Package frontend is a packet cache in front of CoreDNS's server core. It
// owns client-facing sockets of its own, answers fresh hits straight from
// the packet through the cache (Cache), and hands everything else (misses,
// stale and prefetch-due entries, requests the cache does not read) to the
// server of its block, whose ServeDNS runs the whole chain, the cache
// included, as if the request had come through the server's own listener.
package frontend

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/corefile"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	corelog "github.com/coredns/coredns/plugin/log"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/edns"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/coredns/coredns/plugin/pkg/reuseport"
	"github.com/coredns/coredns/plugin/pkg/transport"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Cache is what the front end asks of the cache it stands before.
type Cache interface {
	// Answerer returns what answers requests of server from the cache, for
	// one reader of requests at a time.
	Answerer(server string) Answerer
	// Counters returns the counters of the requests the front end reads
	// for server.
	Counters(server string) Counters
}

// An Answerer answers requests from the cache alone.
type Answerer interface {
	// Answer returns the reply to the request pkt from client when the
	// cache answers it alone, valid until the Answerer's next call, and
	// fills hit; nil hands the request to the chain. now is the time the
	// request came in; tcp says the reply has no size limit but the
	// message's.
	Answer(pkt []byte, client netip.Addr, tcp bool, now time.Time, hit *Hit) []byte
}

// Hit is what the front end learns of a request the cache answered, for
// its log lines; the rest it reads from the reply.
type Hit struct {
	DO      bool
	UDPSize uint16
	Class   response.Class // the reply's, as the log plugin's class filter sees it
}

// Counters count the requests the front end reads, by what became of them.
type Counters struct {
	Hit     prometheus.Counter // answered from the cache
	Chain   prometheus.Counter // handed to the server of the block
	Shed    prometheus.Counter // dropped: the chain had too many in flight
	Dropped prometheus.Counter // unreadable, refused by the kernel on send, or left unanswered as the front end closed

	LogDropped prometheus.Counter // hits whose access log line the log could not take
}

// Config is the `frontend` option.
type Config struct {
	udp, tcp []string      // host:port to listen on
	sockets  int           // UDP sockets per address, each read by one goroutine
	inflight int           // UDP requests through the chain at most (more are shed), and open TCP connections per address
	logEvery int           // log one front-end hit in logEvery; 0 logs none
	poller   bool          // UDP readers wait in the poller, not in recvmmsg
	coalesce time.Duration // a busy thread reader's wait between reads; 0 for none
}

// maxCoalesce bounds coalesce: its pause is every gathered request's
// wait, and a client that keeps few requests in flight gets no more
// answers a pause than it asked in one.
const maxCoalesce = time.Millisecond

const defaultInflight = 1024

// bypassRefused are the plugins that, placed before the cache, decide who
// gets an answer or what it is, or see every request, in ways the front
// end cannot reproduce: hits from the front end would skip them. The view
// plugin, a filter of the server's, is refused apart. The table of
// docs/frontend.md says what a hit does for every plugin that can stand
// before the cache.
var bypassRefused = map[string]string{
	"acl":        "access control",
	"tsig":       "TSIG verification",
	"dns64":      "AAAA synthesis",
	"siit":       "A synthesis",
	"rewrite":    "rewriting of requests and answers",
	"autopath":   "search path completion",
	"dnstap":     "the tap of every message",
	"trace":      "tracing of every request",
	"proxyproto": "PROXY protocol client addresses, which the front end's sockets do not read",
}

// Parse parses `frontend ADDRESS... { sockets N; inflight N; log N; wait
// thread|poller; coalesce DURATION }`, args being the addresses. An
// address is host:port for UDP and TCP, or udp://host:port or
// tcp://host:port for one of them.
func Parse(c *caddy.Controller, args []string) (*Config, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("frontend: want at least one ADDRESS")
	}
	fc := &Config{sockets: procs(), inflight: defaultInflight}
	for _, a := range args {
		network, hostport := "", a
		if i := strings.Index(a, "://"); i >= 0 {
			network, hostport = a[:i], a[i+3:]
		}
		if _, _, err := net.SplitHostPort(hostport); err != nil {
			return nil, fmt.Errorf("frontend: %q is not HOST:PORT: %v", a, err)
		}
		switch network {
		case "", transport.DNS:
			fc.udp, fc.tcp = append(fc.udp, hostport), append(fc.tcp, hostport)
		case "udp":
			fc.udp = append(fc.udp, hostport)
		case "tcp":
			fc.tcp = append(fc.tcp, hostport)
		default:
			return nil, fmt.Errorf("frontend: %q: want dns://, udp:// or tcp://, or no scheme", a)
		}
	}
	err := corefile.Block(c, func(opt string, vals []string) error {
		var n *int
		lowest := 1
		switch opt {
		case "sockets":
			n = &fc.sockets
		case "inflight":
			n = &fc.inflight
		case "log":
			n = &fc.logEvery
			lowest = 0
		case "wait":
			if len(vals) != 1 || vals[0] != "thread" && vals[0] != "poller" {
				return fmt.Errorf("frontend wait: want thread or poller, got %q", vals)
			}
			fc.poller = vals[0] == "poller"
			return nil
		case "coalesce":
			d, err := time.Duration(0), error(nil)
			if len(vals) == 1 {
				d, err = time.ParseDuration(vals[0])
			}
			if len(vals) != 1 || err != nil || d < 0 || d > maxCoalesce {
				return fmt.Errorf("frontend coalesce: want one duration from 0 to %v, got %q", maxCoalesce, vals)
			}
			fc.coalesce = d
			return nil
		default:
			return fmt.Errorf("frontend: unknown option %q", opt)
		}
		if len(vals) != 1 {
			return fmt.Errorf("frontend %s: want one number, got %q", opt, vals)
		}
		v, err := strconv.Atoi(vals[0])
		if err != nil || v < lowest {
			return fmt.Errorf("frontend %s: %q is not a number of at least %d", opt, vals[0], lowest)
		}
		*n = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	if fc.poller && fc.coalesce > 0 {
		return nil, fmt.Errorf("frontend coalesce: wants wait thread, not wait poller")
	}
	return fc, nil
}

// frontend is a running front end: the sockets of its addresses, and the
// server blocks it answers for, which all have these addresses' front end
// and the same server (Setup): several blocks of one address, as
// NodeLocal DNSCache has, share one front end, which gives each request to
// the block of its zone, as the server does, rather than sockets of each
// that SO_REUSEPORT would give requests of every zone.
type frontend struct {
	cfg    *Config
	blocks []*block
	others [][]byte // the zones of the server's other blocks, lowercased wire names: the chain's
	addrs  []string // the server addresses of its blocks, as dnsserver names them
	seq    uint64   // the order it opened in, among the process's (successor)

	udp     []*net.UDPConn  // read through the poller
	threads []*threadSocket // read by threads of their own
	tcp     []net.Listener
	tcpOpen map[string]chan struct{} // a token per connection served, by its listener's socketKey
	started bool                     // threads counted by raiseProcs

	// Set when the server is known, before the sockets are read.
	server *dnsserver.Server
	ctx    context.Context // what the server gives its own requests
	limits tcpLimits       // the server's, for its own TCP listener

	opcodes   [16]bool      // the opcodes besides QUERY and NOTIFY the server accepts
	inflight  chan struct{} // a token per request in the chain
	wg        sync.WaitGroup
	closeOnce sync.Once

	// The TCP connections being served, closed with the front end as
	// miekg/dns's server closes its own (tcp.go).
	conns conns
	// chain counts the UDP requests in the chain, whose replies their
	// sockets must outlive; stopping tells the UDP readers to leave.
	chain    busy
	stopping atomic.Bool

	tcpHits atomic.Uint64 // the TCP connections' hits, for the sampled log

	// What older front ends, closing at a reload before this one started,
	// handed it.
	taken taken
}

// block is a server block a front end answers hits for: its zones, its
// cache, and what its plugins before the cache ask of a hit.
type block struct {
	zones [][]byte // the block's keys' zones, lowercased wire names
	cache Cache
	fm    Counters // set with the server, as the series below

	// The block's prometheus plugin, when one stands before the cache, and
	// what its series need.
	prom       *metrics.Metrics
	promPlugin string // the plugin label of the replies prom counts
	view       string
	series     *metricsZones

	// The block's log plugin, when one stands before the cache, and the
	// writer of its lines.
	logger *corelog.Logger
	access *accessLog

	// chainOnly: a plugin before the cache does to replies what the front
	// end cannot (blockLog): every request of the block goes to the chain.
	chainOnly bool
}

// check refuses a block where the front end would skip plugins that guard
// or change answers, and blocks it cannot serve.
func (fc *Config) check(cfg *dnsserver.Config, cache string) error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("frontend: needs Linux (recvmmsg, sendmmsg)")
	}
	if cfg.Transport != transport.DNS {
		return fmt.Errorf("frontend: the block is served over %s; the front end serves plain DNS blocks only", cfg.Transport)
	}
	if len(cfg.FilterFuncs) > 0 {
		return fmt.Errorf("frontend: hits would bypass the block's filters (view); remove frontend or the filter")
	}
	for _, h := range cfg.Handlers() {
		if h.Name() == cache {
			break // plugins after the cache never see hits anyway
		}
		if what, ok := bypassRefused[h.Name()]; ok {
			return fmt.Errorf("frontend: hits would bypass %s (%s) placed before the cache; remove frontend or %s", h.Name(), what, h.Name())
		}
	}
	return nil
}

// listen opens the front end's sockets: SO_REUSEPORT lets several UDP
// sockets share an address, each read by its own goroutine, and lets a
// reloaded instance open its sockets before the old one closes.
func (fc *Config) listen() (*frontend, error) {
	fe := &frontend{cfg: fc, inflight: make(chan struct{}, fc.inflight), seq: frontends.Add(1)}
	if err := fe.open(); err != nil {
		fe.close()
		return nil, fmt.Errorf("frontend: %w", err)
	}
	return fe, nil
}

// open opens the sockets of every address, up to the first that fails.
func (fe *frontend) open() error {
	for _, a := range fe.cfg.udp {
		for range fe.cfg.sockets {
			if err := fe.openUDP(a); err != nil {
				return err
			}
		}
	}
	for _, a := range fe.cfg.tcp {
		l, err := listenTCP(a)
		if err != nil {
			return err
		}
		fe.tcp = append(fe.tcp, l)
		if fe.tcpOpen == nil {
			fe.tcpOpen = map[string]chan struct{}{}
		}
		fe.tcpOpen[socketKey(l.Addr())] = make(chan struct{}, fe.cfg.inflight)
		recordSocket(fe, l.Addr(), nil)
	}
	return nil
}

// openUDP opens one of a UDP address's sockets, for a reader on a thread
// of its own or in the poller, as `wait` says.
func (fe *frontend) openUDP(addr string) error {
	if !fe.cfg.poller {
		s, err := listenThread(addr)
		if err == nil {
			fe.threads = append(fe.threads, s)
			recordSocket(fe, s.local, s)
		}
		return err
	}
	conn, err := listenUDP(addr)
	if err == nil {
		fe.udp = append(fe.udp, conn)
		recordSocket(fe, conn.LocalAddr(), pollerConn{conn})
	}
	return err
}

// start serves the sockets, handing what is not a hit to srv.
func (fe *frontend) start(srv *dnsserver.Server) {
	fe.server = srv
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, srv)
	fe.ctx = context.WithValue(ctx, dnsserver.LoopKey{}, 0)
	for _, b := range fe.blocks {
		b.fm = b.cache.Counters(srv.Addr)
		if b.prom != nil {
			b.series = newMetricsZones(b.prom, b.promPlugin, srv.Addr, b.view)
		}
		if b.logger != nil {
			b.access = newAccessLog(b.logger, b.fm.LogDropped)
		}
	}
	fe.opcodes = coredns.AllowedOpcodes(srv)
	for _, z := range coredns.ServerZones(srv) {
		w := make([]byte, dnsmsg.MaxNameLen)
		n, err := dns.PackDomainName(strings.ToLower(z), w, 0, nil, false)
		if err == nil && !slices.ContainsFunc(fe.blocks, func(b *block) bool {
			return slices.ContainsFunc(b.zones, func(bz []byte) bool { return slices.Equal(bz, w[:n]) })
		}) {
			fe.others = append(fe.others, w[:n])
		}
	}
	fe.limits = limitsOf(srv)
	for _, conn := range fe.udp {
		fe.wg.Go(func() { fe.serveUDP(conn) })
	}
	if len(fe.threads) > 0 {
		raiseProcs(len(fe.threads))
		fe.started = true
	}
	for _, s := range fe.threads {
		fe.wg.Go(func() { fe.serveThread(s) })
	}
	for _, l := range fe.tcp {
		fe.wg.Go(func() { fe.serveTCP(l) })
	}
	for _, serve := range fe.taken.done(true) {
		serve(fe)
	}
}

// close stops the readers and waits for them; the sockets close once the
// replies in flight are written (closeSockets). Only the first call does: a
// front end whose server was not found is closed at once and again at its instance's
// shutdown, and a threadSocket's descriptor, closed twice, could close
// another file that took its number.
func (fe *frontend) close() { fe.closeOnce.Do(fe.closeSockets) }

// The UDP sockets stay open, unread, until the chain has sent its replies
// to the requests they read, as miekg/dns's server stops reading
// its socket and closes it once its handlers have returned: a miss in
// flight at a reload got no reply, its write failing on the closed socket.
func (fe *frontend) closeSockets() {
	fe.stopping.Store(true)
	for _, conn := range fe.udp {
		conn.SetReadDeadline(aLongTimeAgo)
	}
	for _, s := range fe.threads {
		s.shutdown()
	}
	for _, l := range fe.tcp {
		stopAccepting(l)
	}
	fe.conns.close()
	fe.wg.Wait()
	if fe.started {
		raiseProcs(-len(fe.threads))
	}
	for _, serve := range fe.taken.done(false) {
		serve(nil)
	}
	// caddy starts the new instance's front ends only once the old
	// instance's shutdown callbacks, this one's among them, have returned:
	// waiting here would hold up every request to the new sockets. Nor
	// should a socket stay in its address's SO_REUSEPORT group unread any
	// longer than the chain's replies need it, since the datagrams that come
	// to it are lost: not at all on an address a newer front end's sockets
	// can send those replies from (successor.go), whatever its other
	// addresses.
	gone, kept := fe.succeededUDP()
	fe.drainUDP(gone)
	fe.closeUDP(gone)
	after(&fe.chain, func() {
		fe.closeUDP(kept)
		forgetSockets(fe) // its TCP listeners'
	})
	for _, l := range fe.tcp {
		fe.closeListener(l)
	}
	after(&fe.conns.readers, fe.closeTCP)
}

// after calls then once the goroutines f counts have ended, or the grace
// time CoreDNS's server gives its own at a reload or a stop has passed: at
// once when none runs, else from a goroutine of its own.
func after(f *busy, then func()) {
	if f.n.Load() == 0 {
		then()
		return
	}
	go func() {
		waitAtMost(grace, &f.wg)
		then()
	}()
}

// closeUDP closes the UDP sockets socks, whose readers have left, once
// forgotten: the chain's replies then leave through another's.
func (fe *frontend) closeUDP(socks udpSockets) {
	forget(fe, socks.has)
	for _, conn := range socks.udp {
		conn.Close()
	}
	for _, s := range socks.threads {
		s.close()
	}
}

// closeTCP closes the connections whose reply did not come in time, and
// the access logs, which the readers, gone, no longer write to.
func (fe *frontend) closeTCP() {
	fe.conns.closeAll()
	for _, b := range fe.blocks {
		b.access.close()
	}
}

// busy counts goroutines whose replies a closed front end waits for.
type busy struct {
	wg sync.WaitGroup
	n  atomic.Int64
}

func (f *busy) add() {
	f.n.Add(1)
	f.wg.Add(1)
}

func (f *busy) done() {
	f.n.Add(-1)
	f.wg.Done()
}

// grace is how long a closed front end waits for the replies in flight:
// dnsserver's graceTimeout, which it does not export.
const grace = 5 * time.Second

// waitAtMost waits for wg, for d at most, and reports whether it ended.
func waitAtMost(d time.Duration, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// reader is what one reader of requests (a UDP socket's goroutine, a TCP
// connection's) holds for each block, by the block's index, and its count
// of hits since one was logged (logHit).
type reader struct {
	series      []*requestMetrics
	sinceLogged int
}

func (fe *frontend) newReader() *reader {
	r := &reader{series: make([]*requestMetrics, len(fe.blocks))}
	for i, b := range fe.blocks {
		r.series[i] = b.series.reader()
	}
	return r
}

// answerers returns an Answerer of each block's cache.
func (fe *frontend) answerers() []Answerer {
	a := make([]Answerer, len(fe.blocks))
	for i, b := range fe.blocks {
		a[i] = b.cache.Answerer(fe.server.Addr)
	}
	return a
}

// blockOf returns the index of the block that serves the request pkt, as
// the server picks it: the longest of the server's zones that holds the
// question's name, for DS the shortest but the root (the parent's side of
// a delegation); -1 for none, for a zone of one of the server's other
// blocks, or a question that does not read.
func (fe *frontend) blockOf(pkt []byte) int {
	if len(fe.blocks) == 1 && len(fe.others) == 0 {
		return 0 // the server hands what is not its zones' to the chain's refusal
	}
	end := dnsmsg.NameEnd(pkt, dnsmsg.HeaderLen)
	if end < 0 {
		return -1
	}
	name := pkt[dnsmsg.HeaderLen:end]
	ds := len(pkt) >= end+2 && binary.BigEndian.Uint16(pkt[end:]) == dns.TypeDS
	best, found := -1, false
	for off := 0; off < len(name); off += int(name[off]) + 1 {
		if i, ok := fe.zoneOf(name[off:]); ok && (!found || ds && name[off] != 0) {
			best, found = i, true
			if !ds {
				break
			}
		}
		if name[off] == 0 {
			break
		}
	}
	return best
}

// zoneOf returns the index of the block whose zone name is, -1 for one of
// the server's other blocks, and whether any block has it.
func (fe *frontend) zoneOf(name []byte) (int, bool) {
	for i, b := range fe.blocks {
		for _, z := range b.zones {
			if dnsmsg.EqualFoldWire(z, name) {
				return i, true
			}
		}
	}
	for _, z := range fe.others {
		if dnsmsg.EqualFoldWire(z, name) {
			return -1, true
		}
	}
	return -1, false
}

// answer answers the request pkt from client from the cache of its block:
// the reply and the block's index, or nil when the request goes to the
// chain. now is when the request came in, read once for a batch of
// datagrams. A hit's bookkeeping is account's, once its reply is sent.
func (fe *frontend) answer(as []Answerer, pkt []byte, client netip.Addr, tcp bool, now time.Time, hit *Hit) ([]byte, int) {
	i := fe.blockOf(pkt)
	if i < 0 || fe.blocks[i].chainOnly {
		return nil, i
	}
	return as[i].Answer(pkt, client, tcp, now, hit), i
}

// account counts a hit of block whose reply went to the kernel, took after
// its request came in: in the front end's hits, or its dropped requests
// when the kernel refused the reply (sent false), and as the plugins
// before the cache would: in the block's series and access log, and in
// the sampled log. It runs after the send, as theirs do, so that a reply
// waits neither for its own bookkeeping nor for that of the replies before
// it in its run.
func (fe *frontend) account(r *reader, block int, pkt, reply []byte, local, client netip.AddrPort, tcp, sent bool, hit *Hit, took time.Duration) {
	b := fe.blocks[block]
	if sent {
		b.fm.Hit.Inc()
	} else {
		b.fm.Dropped.Inc()
	}
	r.series[block].count(reply, len(pkt), client.Addr(), tcp, hit, took)
	b.access.hit(pkt, reply, local, client, tcp, hit, took)
	since := &r.sinceLogged
	if tcp {
		since = nil // the connections' readers count together (logHit)
	}
	fe.logHit(since, hit, len(pkt), reply, client, tcp)
}

// counters returns the counters of the block of the request pkt, or of the
// first block for a request of none.
func (fe *frontend) counters(pkt []byte) Counters {
	if i := fe.blockOf(pkt); i >= 0 {
		return fe.blocks[i].fm
	}
	return fe.blocks[0].fm
}

// timed reports whether a request's arrival and its reply's sending must
// be timed: for the series or the access log of some block.
func (fe *frontend) timed() bool {
	for _, b := range fe.blocks {
		if b.series != nil || b.access != nil {
			return true
		}
	}
	return false
}

// toChain hands a request to the server's ServeDNS in a goroutine of its
// own, at most inflight at a time: past that the request is shed, answered
// SERVFAIL and counted, as a flood of misses must not grow goroutines
// without bound, and a client left without a reply waits out its timeout
// (5 s for a pod's resolver) before it tries again.
func (fe *frontend) toChain(pkt []byte, w *chainWriter) {
	if fe.stopping.Load() {
		req := slices.Clone(pkt)
		if fe.handOver(w.local, func(next *frontend) {
			if next == nil {
				fe.counters(req).Dropped.Inc() // it closed before it started
				return
			}
			next.toChain(req, w)
		}) {
			return
		}
	}
	fm := fe.counters(pkt)
	if ignored(pkt) {
		fm.Dropped.Inc() // what serveChain would do, without a slot
		return
	}
	select {
	case fe.inflight <- struct{}{}:
	default:
		fm.Shed.Inc()
		if reply := shedReply(pkt); reply != nil {
			w.Write(reply)
		}
		return
	}
	req := append([]byte(nil), pkt...)
	fe.chain.add()
	go func() {
		defer func() {
			<-fe.inflight
			fe.chain.done()
		}()
		fe.serveChain(req, w)
	}()
}

// shedReply returns the SERVFAIL that answers a shed request pkt: its
// header, as a reply, its question, and for a request with EDNS an OPT
// record as CoreDNS's server gives its own error replies (request.SizeAndDo:
// the request's UDP size and DO bit, version 0), which RFC 6891 6.1.1 asks
// of every reply to one; or nil for a request whose question does not read
// (it gets no reply, as a malformed one would not).
func shedReply(pkt []byte) []byte {
	if len(pkt) < dnsmsg.HeaderLen || binary.BigEndian.Uint16(pkt[dnsmsg.OffQDCount:]) != 1 {
		return nil
	}
	end := dnsmsg.NameEnd(pkt, dnsmsg.HeaderLen)
	if end < 0 || len(pkt) < end+4 {
		return nil
	}
	reply := append([]byte(nil), pkt[:end+4]...)
	flags := binary.BigEndian.Uint16(reply[dnsmsg.OffFlags:])
	if flags&dnsmsg.QR != 0 {
		return nil // a reply: answering it could loop
	}
	// QR and SERVFAIL; opcode, RD and CD kept; the rest cleared.
	flags = dnsmsg.QR | flags&(0xF<<11|dnsmsg.RD|dnsmsg.CD) | dns.RcodeServerFailure
	binary.BigEndian.PutUint16(reply[dnsmsg.OffFlags:], flags)
	clear(reply[dnsmsg.OffANCount:dnsmsg.HeaderLen])
	if size, do, ok := requestOPT(pkt, end+4); ok {
		var ttl uint32 // extended RCODE 0, version 0
		if do {
			ttl = 1 << 15
		}
		reply = append(reply, 0) // root owner
		reply = binary.BigEndian.AppendUint16(reply, dns.TypeOPT)
		reply = binary.BigEndian.AppendUint16(reply, size)
		reply = binary.BigEndian.AppendUint32(reply, ttl)
		reply = binary.BigEndian.AppendUint16(reply, 0) // no options
		binary.BigEndian.PutUint16(reply[dnsmsg.OffARCount:], 1)
	}
	return reply
}

// requestOPT returns the UDP size and the DO bit of the OPT record in the
// additional section of the request pkt, whose question ends at off, and
// whether it has one there.
func requestOPT(pkt []byte, off int) (size uint16, do, ok bool) {
	an := int(binary.BigEndian.Uint16(pkt[dnsmsg.OffANCount:]))
	ns := int(binary.BigEndian.Uint16(pkt[dnsmsg.OffNSCount:]))
	ar := int(binary.BigEndian.Uint16(pkt[dnsmsg.OffARCount:]))
	for i := range an + ns + ar {
		owner := off
		if off = skipName(pkt, off); off < 0 || len(pkt) < off+10 {
			return 0, false, false
		}
		if i >= an+ns && pkt[owner] == 0 && binary.BigEndian.Uint16(pkt[off:]) == dns.TypeOPT {
			return binary.BigEndian.Uint16(pkt[off+2:]), pkt[off+6]&0x80 != 0, true
		}
		off += 10 + int(binary.BigEndian.Uint16(pkt[off+8:]))
	}
	return 0, false, false
}

// skipName returns the offset past the name at off in pkt, compressed or
// not, or -1 when pkt ends first.
func skipName(pkt []byte, off int) int {
	for off < len(pkt) {
		switch l := int(pkt[off]); {
		case l == 0:
			return off + 1
		case l&0xC0 == 0xC0:
			if off+2 > len(pkt) {
				return -1
			}
			return off + 2
		case l > 63:
			return -1
		default:
			off += l + 1
		}
	}
	return -1
}

// ignored reports whether miekg/dns's server would leave the request pkt
// without a reply: it has no header, or it is a reply itself.
func ignored(pkt []byte) bool {
	return len(pkt) < dnsmsg.HeaderLen || binary.BigEndian.Uint16(pkt[dnsmsg.OffFlags:])&dnsmsg.QR != 0
}

// serveChain does what miekg/dns's server does with a request before its
// handler: it checks the header the way CoreDNS's server asks it to, unpacks
// the request, checks its TSIG; then the server's ServeDNS runs the chain.
// It counts the request once: dropped when it does not read (answered
// FORMERR if it has a header), else handed to the chain.
func (fe *frontend) serveChain(pkt []byte, w *chainWriter) {
	fm := fe.counters(pkt)
	if ignored(pkt) {
		fm.Dropped.Inc()
		return // no ID to answer, or a reply: a reply could only amplify or loop
	}
	h := dns.Header{
		Id:      binary.BigEndian.Uint16(pkt[dnsmsg.OffID:]),
		Bits:    binary.BigEndian.Uint16(pkt[dnsmsg.OffFlags:]),
		Qdcount: binary.BigEndian.Uint16(pkt[dnsmsg.OffQDCount:]),
		Ancount: binary.BigEndian.Uint16(pkt[dnsmsg.OffANCount:]),
		Nscount: binary.BigEndian.Uint16(pkt[dnsmsg.OffNSCount:]),
		Arcount: binary.BigEndian.Uint16(pkt[dnsmsg.OffARCount:]),
	}
	action := dns.DefaultMsgAcceptFunc(h)
	// CoreDNS's server accepts the opcodes its plugins allow, with one
	// question, and rejects them with any other number as malformed.
	if action == dns.MsgRejectNotImplemented && fe.opcodes[h.Bits>>11&0xF] {
		action = dns.MsgAccept
		if h.Qdcount != 1 {
			action = dns.MsgReject
		}
	}
	r := new(dns.Msg)
	switch action {
	case dns.MsgAccept:
		err := r.Unpack(pkt)
		if err == nil {
			break
		}
		fm.Dropped.Inc()
		w.WriteMsg(rejection(r, h, false))
		return
	case dns.MsgReject, dns.MsgRejectNotImplemented:
		fm.Chain.Inc()
		w.WriteMsg(rejection(r, h, action == dns.MsgRejectNotImplemented))
		return
	default:
		fm.Dropped.Inc()
		return
	}
	fm.Chain.Inc()
	if t := r.IsTsig(); t != nil {
		w.verifyTSIG(pkt, t, fe.server.TsigSecret)
	}
	fe.server.ServeDNS(fe.ctx, w, r)
}

// rejection turns r, the request as far as it unpacked, into miekg/dns's
// server's reply to a request it rejects: the request's header bits and
// question (when it got that far), FORMERR or NOTIMP, nothing else.
func rejection(r *dns.Msg, h dns.Header, notImplemented bool) *dns.Msg {
	opcode := int(h.Bits>>11) & 0xF
	r.Truncated = h.Bits&dnsmsg.TC != 0
	r.RecursionDesired = h.Bits&dnsmsg.RD != 0
	r.RecursionAvailable = h.Bits&dnsmsg.RA != 0
	r.AuthenticatedData = h.Bits&dnsmsg.AD != 0
	r.CheckingDisabled = h.Bits&dnsmsg.CD != 0
	r.Id = h.Id
	r.SetRcodeFormatError(r)
	r.Zero = false
	if notImplemented {
		r.Opcode, r.Rcode = opcode, dns.RcodeNotImplemented
	}
	r.Answer, r.Ns, r.Extra = nil, nil, nil
	return r
}

// chainWriter takes the chain's reply to one request to its client.
type chainWriter struct {
	local, remote net.Addr

	udp udpSender
	fe  *frontend // whose socket udp is
	to  netip.AddrPort
	oob []byte // the reply's control message: its source (frontend_linux.go)
	tcp *tcpConn

	tsigSecret     string // of the request's TSIG, when it verified
	tsigStatus     error
	tsigMAC        string
	tsigTimersOnly bool
}

func (w *chainWriter) LocalAddr() net.Addr  { return w.local }
func (w *chainWriter) RemoteAddr() net.Addr { return w.remote }
func (w *chainWriter) Close() error         { return nil }
func (w *chainWriter) Hijack()              {}
func (w *chainWriter) TsigStatus() error    { return w.tsigStatus }
func (w *chainWriter) TsigTimersOnly(b bool) {
	w.tsigTimersOnly = b
}

// WriteMsg packs m, signed when it carries a TSIG record as miekg/dns's
// server signs.
func (w *chainWriter) WriteMsg(m *dns.Msg) error {
	if t := m.IsTsig(); t != nil && w.tsigSecret != "" {
		b, mac, err := dns.TsigGenerate(m, w.tsigSecret, w.tsigMAC, w.tsigTimersOnly)
		if err != nil {
			return err
		}
		w.tsigMAC = mac
		_, err = w.Write(b)
		return err
	}
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

func (w *chainWriter) Write(b []byte) (int, error) {
	if w.tcp != nil {
		return w.tcp.write(b)
	}
	n, err := w.send(w.udp, b)
	if errors.Is(err, net.ErrClosed) {
		// The front end whose socket it was closed, and another's socket on
		// the same address took its place: a newer one's at a reload, the
		// running one's when a reload failed.
		if o, ok := newest(w.local); ok && o.s != nil {
			return w.send(o.s, b)
		}
	}
	return n, err
}

// send sends b to the client through s.
func (w *chainWriter) send(s udpSender, b []byte) (int, error) {
	if len(w.oob) > 0 {
		if n, err := s.sendmsg(b, w.oob, w.to); err == nil {
			return n, nil
		}
		// No reply can leave from a broadcast or multicast destination:
		// the routing's source then, as without.
	}
	return s.sendmsg(b, nil, w.to)
}

// udpSender sends a datagram to a client, from the source a control
// message names, or with none the routing's: a socket in Go's poller
// (pollerConn) or one read on a thread of its own (threadSocket).
type udpSender interface {
	sendmsg(p, oob []byte, to netip.AddrPort) (int, error)
}

// pollerConn is a socket in Go's poller, as a udpSender.
type pollerConn struct{ *net.UDPConn }

func (c pollerConn) sendmsg(p, oob []byte, to netip.AddrPort) (int, error) {
	n, _, err := c.WriteMsgUDPAddrPort(p, oob, to)
	return n, err
}

// verifyTSIG sets the TSIG status of the request pkt for the plugins, with
// the server's secrets, as miekg/dns's server does.
func (w *chainWriter) verifyTSIG(pkt []byte, t *dns.TSIG, secrets map[string]string) {
	secret, ok := secrets[t.Hdr.Name]
	if !ok {
		w.tsigStatus = dns.ErrSecret
		return
	}
	w.tsigStatus = dns.TsigVerify(pkt, secret, "", false)
	w.tsigSecret, w.tsigMAC = secret, t.MAC
}

var log = clog.NewWithPlugin("compactcache")

// opened are the front ends whose sockets are open, each started once its
// instance's servers run: only then does caddy know them, and a front end
// needs its block's. One whose instance never starts is closed, or
// clients' datagrams would go to sockets nobody reads (SO_REUSEPORT shares
// the address).
var opened = lifecycle.New(startFrontend, (*frontend).close)

func startFrontend(inst *caddy.Instance, fe *frontend) {
	srv := coredns.Server(inst, fe.addrs)
	if srv == nil {
		log.Errorf("frontend: no server for %s among the instance's; the front end stays closed", strings.Join(fe.addrs, ", "))
		fe.close()
		return
	}
	fe.start(srv)
}

// Setup opens the front end fc of the block of cfg at startup, before
// cache, the plugin named name, and registers it to start with the block's
// servers.
func Setup(c *caddy.Controller, cfg *dnsserver.Config, fc *Config, name string, cache Cache) error {
	if err := fc.check(cfg, name); err != nil {
		return err
	}
	b := &block{cache: cache, view: cfg.ViewName}
	b.prom, b.promPlugin = blockMetrics(cfg, name)
	var logs bool
	b.logger, logs = blockLog(cfg, name)
	b.chainOnly = !logs
	for _, k := range c.ServerBlockKeys {
		for _, z := range plugin.Host(k).NormalizeExact() {
			w := make([]byte, dnsmsg.MaxNameLen)
			n, err := dns.PackDomainName(strings.ToLower(z), w, 0, nil, false)
			if err != nil {
				return fmt.Errorf("frontend: zone %q: %v", z, err)
			}
			b.zones = append(b.zones, w[:n])
		}
	}
	addrs := coredns.ServerAddrs(c)
	for _, fe := range opened.Of(c) {
		if !slices.Equal(fe.cfg.udp, fc.udp) || !slices.Equal(fe.cfg.tcp, fc.tcp) {
			continue
		}
		// Another block of this instance has the front end of these
		// addresses: one front end serves both, by zone.
		if !slices.Equal(fe.addrs, addrs) {
			return fmt.Errorf("frontend: %s is the front end of blocks served on %s; a block served on %s cannot share it: give it a front end of its own addresses",
				strings.Join(fc.udp, " "), strings.Join(fe.addrs, " "), strings.Join(addrs, " "))
		}
		if o := fe.cfg; o.sockets != fc.sockets || o.inflight != fc.inflight || o.logEvery != fc.logEvery || o.poller != fc.poller || o.coalesce != fc.coalesce {
			return fmt.Errorf("frontend: the blocks that share the front end %s give it different options (sockets, inflight, log, wait, coalesce): give them the same", strings.Join(fc.udp, " "))
		}
		fe.blocks = append(fe.blocks, b)
		return nil
	}
	fe, err := fc.listen()
	if err != nil {
		return err
	}
	fe.blocks, fe.addrs = []*block{b}, addrs
	opened.Add(c, fe)
	lifecycle.OnStop(c, fe.close)
	return nil
}

// listenUDP opens a UDP socket on addr. On the unspecified address it asks
// for each request's destination at once, before any request arrives, so
// that every reply can leave from the address its request came to (see
// udpBatch.pktinfo).
func listenUDP(addr string) (*net.UDPConn, error) {
	pc, err := reuseport.ListenPacket("udp", addr)
	if err != nil {
		return nil, err
	}
	conn := pc.(*net.UDPConn)
	if unspecified(conn.LocalAddr()) {
		if err := askDestinations(conn); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return conn, nil
}

// unspecified reports whether a is a UDP address of 0.0.0.0 or ::.
func unspecified(a net.Addr) bool {
	u, ok := a.(*net.UDPAddr)
	return ok && u.IP.IsUnspecified()
}

func listenTCP(addr string) (net.Listener, error) { return reuseport.Listen("tcp", addr) }

// logHit logs one hit in logEvery in the common format of the log plugin,
// without the duration; *since counts the hits since the last one logged,
// or for nil the TCP connections' hits do.
func (fe *frontend) logHit(since *int, hit *Hit, reqLen int, reply []byte, client netip.AddrPort, tcp bool) {
	if fe.cfg.logEvery == 0 {
		return
	}
	if since == nil {
		// A TCP connection's reader: most connections see fewer than
		// logEvery hits, so theirs are counted together.
		if fe.tcpHits.Add(1)%uint64(fe.cfg.logEvery) != 0 {
			return
		}
	} else {
		if *since++; *since < fe.cfg.logEvery {
			return
		}
		*since = 0
	}
	name, off, err := dns.UnpackDomainName(reply, dnsmsg.HeaderLen)
	if err != nil || len(reply) < off+4 {
		return // the reply writer wrote it: it unpacks
	}
	h := header(reply)
	qtype, qclass := binary.BigEndian.Uint16(reply[off:]), binary.BigEndian.Uint16(reply[off+2:])
	proto := "udp"
	if tcp {
		proto = "tcp"
	}
	// The client, the buffer size and the flags as the log plugin writes
	// them: a dual-stack socket's IPv4 client unmapped, the size its
	// request.Request reads.
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	log.Infof("%s - %d \"%s %s %s %s %d %t %d\" %s %s %d (front end hit, 1 in %d logged)",
		client, h.Id, dns.Type(qtype), dns.Class(qclass), name, proto, reqLen, hit.DO, edns.Size(proto, hit.UDPSize),
		dns.RcodeToString[h.Rcode], flags(h), len(reply), fe.cfg.logEvery)
}

// flags returns the flags of h as the log plugin's {>rflags} writes them.
func flags(h dns.MsgHdr) string {
	var f []string
	for _, flag := range []struct {
		set  bool
		name string
	}{
		{h.Response, "qr"}, {h.Authoritative, "aa"}, {h.Truncated, "tc"}, {h.RecursionDesired, "rd"},
		{h.RecursionAvailable, "ra"}, {h.Zero, "z"}, {h.AuthenticatedData, "ad"}, {h.CheckingDisabled, "cd"},
	} {
		if flag.set {
			f = append(f, flag.name)
		}
	}
	return strings.Join(f, ",")
}
