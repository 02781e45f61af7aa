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
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	corelog "github.com/coredns/coredns/plugin/log"
	"github.com/coredns/coredns/plugin/pkg/response"

	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/metrics"
	clog "github.com/coredns/coredns/plugin/pkg/log"
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
	// Now returns the time at the cache's resolution.
	Now() time.Time
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
	Dropped prometheus.Counter // unreadable, cut, or refused by the kernel on send

	LogDropped prometheus.Counter // hits whose access log line the log could not take
}

// Config is the `frontend` option.
type Config struct {
	udp, tcp []string // host:port to listen on
	sockets  int      // UDP sockets per address, each read by one goroutine
	inflight int      // requests through the chain at most; more are shed
	logEvery int      // log one front-end hit in logEvery; 0 logs none
}

const (
	defaultInflight = 1024
	// tcpIdle closes TCP connections idle this long, CoreDNS's default.
	tcpIdle = 10 * time.Second
)

// bypassRefused are the plugins that, placed before the cache, decide who
// gets an answer or what it is, or see every request, in ways the front
// end cannot reproduce: hits from the front end would skip them. The view
// plugin, a filter of the server's, is refused apart. README's table says
// what a hit does for every plugin that can stand before the cache.
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

// Parse parses `frontend ADDRESS... { sockets N; inflight N; log N }`, args
// being the addresses. An address is host:port for UDP and TCP, or
// udp://host:port or tcp://host:port for one of them.
func Parse(c *caddy.Controller, args []string) (*Config, error) {
	// RemainingArgs stops before a block's brace, on the same line.
	block := c.NextArg()
	if len(args) == 0 {
		return nil, fmt.Errorf("frontend: want at least one ADDRESS")
	}
	fc := &Config{sockets: runtime.GOMAXPROCS(0), inflight: defaultInflight}
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
	for block && c.Next() && c.Val() != "}" {
		opt, vals := c.Val(), c.RemainingArgs()
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
		default:
			return nil, fmt.Errorf("frontend: unknown option %q", opt)
		}
		if len(vals) != 1 {
			return nil, fmt.Errorf("frontend %s: want one number, got %q", opt, vals)
		}
		v, err := strconv.Atoi(vals[0])
		if err != nil || v < lowest {
			return nil, fmt.Errorf("frontend %s: %q is not a number of at least %d", opt, vals[0], lowest)
		}
		*n = v
	}
	return fc, nil
}

// frontend is a running front end.
type frontend struct {
	c   Cache
	cfg *Config

	udp []*net.UDPConn
	tcp []net.Listener

	// Set when the server is known, before the sockets are read.
	server *dnsserver.Server
	ctx    context.Context // what the server gives its own requests
	fm     Counters

	// The block's prometheus plugin, when one stands before the cache, and
	// what its series need, known once the server is.
	prom  *metrics.Metrics
	view  string
	zones *metricsZones

	// The block's log plugin, when one stands before the cache, and the
	// writer of its lines, started with the server.
	logger *corelog.Logger
	access *accessLog

	// chainOnly: a plugin before the cache does to replies what the front
	// end cannot (blockLog): every request goes to the chain.
	chainOnly bool

	opcodes  [16]bool      // the opcodes besides QUERY and NOTIFY the server accepts
	inflight chan struct{} // a token per request in the chain
	wg       sync.WaitGroup
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
func (fc *Config) listen(c Cache) (*frontend, error) {
	fe := &frontend{c: c, cfg: fc, inflight: make(chan struct{}, fc.inflight)}
	for _, a := range fc.udp {
		for range fc.sockets {
			conn, err := listenUDP(a)
			if err != nil {
				fe.close()
				return nil, fmt.Errorf("frontend: %w", err)
			}
			fe.udp = append(fe.udp, conn)
		}
	}
	for _, a := range fc.tcp {
		l, err := listenTCP(a)
		if err != nil {
			fe.close()
			return nil, fmt.Errorf("frontend: %w", err)
		}
		fe.tcp = append(fe.tcp, l)
	}
	return fe, nil
}

// start serves the sockets, handing what is not a hit to srv.
func (fe *frontend) start(srv *dnsserver.Server) {
	fe.server = srv
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, srv)
	fe.ctx = context.WithValue(ctx, dnsserver.LoopKey{}, 0)
	fe.fm = fe.c.Counters(srv.Addr)
	if fe.prom != nil {
		fe.zones = newMetricsZones(fe.prom, srv.Addr, fe.view)
	}
	if fe.logger != nil {
		fe.access = newAccessLog(fe.logger, fe.fm.LogDropped)
	}
	fe.opcodes = coredns.AllowedOpcodes(srv)
	for _, conn := range fe.udp {
		fe.wg.Go(func() { fe.serveUDP(conn) })
	}
	for _, l := range fe.tcp {
		fe.wg.Go(func() { fe.serveTCP(l) })
	}
}

// close closes the sockets and waits for their readers; requests in the
// chain finish on their own.
func (fe *frontend) close() {
	for _, conn := range fe.udp {
		conn.Close()
	}
	for _, l := range fe.tcp {
		l.Close()
	}
	fe.wg.Wait()
	fe.access.close()
}

// answer asks a of the request pkt, unless the block's plugins need every
// request in the chain.
func (fe *frontend) answer(a Answerer, pkt []byte, client netip.Addr, tcp bool, now time.Time, hit *Hit) []byte {
	if fe.chainOnly {
		return nil
	}
	return a.Answer(pkt, client, tcp, now, hit)
}

// toChain hands a request to the server's ServeDNS in a goroutine of its
// own, at most inflight at a time: past that the request is dropped and
// counted, as a flood of misses must not grow goroutines without bound.
func (fe *frontend) toChain(pkt []byte, w *chainWriter) {
	select {
	case fe.inflight <- struct{}{}:
	default:
		fe.fm.Shed.Inc()
		return
	}
	fe.fm.Chain.Inc()
	req := append([]byte(nil), pkt...)
	go func() {
		defer func() { <-fe.inflight }()
		fe.serveChain(req, w)
	}()
}

// serveChain does what miekg/dns's server does with a request before its
// handler: it checks the header the way CoreDNS's server asks it to, unpacks
// the request, checks its TSIG; then the server's ServeDNS runs the chain.
func (fe *frontend) serveChain(pkt []byte, w *chainWriter) {
	if len(pkt) < dnsmsg.HeaderLen {
		fe.fm.Dropped.Inc()
		return // no ID to answer: a reply could only amplify
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
	// CoreDNS's server accepts the opcodes its plugins allow.
	if action == dns.MsgRejectNotImplemented && fe.opcodes[h.Bits>>11&0xF] && h.Qdcount == 1 {
		action = dns.MsgAccept
	}
	r := new(dns.Msg)
	switch action {
	case dns.MsgAccept:
		err := r.Unpack(pkt)
		if err == nil {
			break
		}
		fe.fm.Dropped.Inc()
		fallthrough
	case dns.MsgReject, dns.MsgRejectNotImplemented:
		w.WriteMsg(rejection(r, h, action == dns.MsgRejectNotImplemented))
		return
	default:
		fe.fm.Dropped.Inc()
		return
	}
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

	udp *net.UDPConn
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
	if len(w.oob) > 0 {
		n, _, err := w.udp.WriteMsgUDPAddrPort(b, w.oob, w.to)
		if err == nil {
			return n, nil
		}
		// No reply can leave from a broadcast or multicast destination:
		// the routing's source then, as without.
	}
	return w.udp.WriteToUDPAddrPort(b, w.to)
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

// frontendsKey keeps, in a caddy instance's storage, the front ends its
// blocks opened, until the instance's servers are up.
type frontendsKey struct{}

// pendingFrontend is a front end waiting for its server.
type pendingFrontend struct {
	fe    *frontend
	addrs []string // the server addresses of the block, as dnsserver names them
}

func init() { caddy.RegisterEventHook("compactcache-frontend", startFrontends) }

// startFrontends starts the front ends of an instance once its servers
// run: only then does caddy know them, and a front end needs its block's.
func startFrontends(event caddy.EventName, info any) error {
	inst, ok := info.(*caddy.Instance)
	if event != caddy.InstanceStartupEvent || !ok {
		return nil
	}
	inst.StorageMu.RLock()
	pending, _ := inst.Storage[frontendsKey{}].([]pendingFrontend)
	inst.StorageMu.RUnlock()
	for _, p := range pending {
		unstarted.remove(p.fe)
		srv := coredns.Server(inst, p.addrs)
		if srv == nil {
			log.Errorf("frontend: no server for %s among the instance's; the front end stays closed", strings.Join(p.addrs, ", "))
			p.fe.close()
			continue
		}
		p.fe.start(srv)
	}
	// What is left belongs to an instance that never started: a failed
	// reload whose old instance had no compactcache to close it.
	unstarted.closeAll()
	return nil
}

// CloseUnstarted closes the front ends whose instance's servers never
// started: a reload failed after their blocks were set up.
func CloseUnstarted() { unstarted.closeAll() }

// unstarted are the front ends whose sockets are open and whose instance's
// servers are not up yet. A reload that fails after a block's front end
// opened its sockets drops the new instance without shutting it down: the
// old instance closes them (unstarted.closeAll) if it has compactcache, else the
// next instance that starts does, or clients' datagrams would go to sockets
// nobody reads (SO_REUSEPORT shares the address).
var unstarted = frontendSet{m: map[*frontend]bool{}}

type frontendSet struct {
	mu sync.Mutex
	m  map[*frontend]bool
}

func (s *frontendSet) add(fe *frontend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[fe] = true
}

func (s *frontendSet) remove(fe *frontend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, fe)
}

// closeAll closes the front ends in s and empties it.
func (s *frontendSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for fe := range s.m {
		fe.close()
		delete(s.m, fe)
	}
}

// blockAddrs returns the addresses dnsserver gives the servers of cfg's
// block.
func blockAddrs(cfg *dnsserver.Config) []string {
	addrs := make([]string, 0, len(cfg.ListenHosts))
	for _, h := range cfg.ListenHosts {
		addrs = append(addrs, cfg.Transport+"://"+net.JoinHostPort(h, cfg.Port))
	}
	return addrs
}

// Setup opens the front end fc of the block of cfg at startup, before
// cache, the plugin named name, and registers it to start with the block's
// servers.
func Setup(c *caddy.Controller, cfg *dnsserver.Config, fc *Config, name string, cache Cache) error {
	if err := fc.check(cfg, name); err != nil {
		return err
	}
	fe, err := fc.listen(cache)
	if err != nil {
		return err
	}
	fe.prom, fe.view = blockMetrics(cfg, name), cfg.ViewName
	var logs bool
	fe.logger, logs = blockLog(cfg, name)
	fe.chainOnly = !logs
	unstarted.add(fe)
	pending, _ := c.Get(frontendsKey{}).([]pendingFrontend)
	c.Set(frontendsKey{}, append(pending, pendingFrontend{fe: fe, addrs: blockAddrs(cfg)}))
	c.OnShutdown(func() error {
		fe.close()
		return nil
	})
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
// without the duration; *since counts the hits since the last one logged.
func (fe *frontend) logHit(since *int, hit *Hit, reqLen int, reply []byte, client netip.AddrPort, proto string) {
	if fe.cfg.logEvery == 0 {
		return
	}
	if *since++; *since < fe.cfg.logEvery {
		return
	}
	*since = 0
	name, off, err := dns.UnpackDomainName(reply, dnsmsg.HeaderLen)
	if err != nil || len(reply) < off+4 {
		return // the reply writer wrote it: it unpacks
	}
	id := binary.BigEndian.Uint16(reply[dnsmsg.OffID:])
	rcode := int(binary.BigEndian.Uint16(reply[dnsmsg.OffFlags:]) & 0xF)
	qtype, qclass := binary.BigEndian.Uint16(reply[off:]), binary.BigEndian.Uint16(reply[off+2:])
	log.Infof("%s - %d \"%s %s %s %s %d %t %d\" %s %d (front end hit, 1 in %d logged)",
		client, id, dns.Type(qtype), dns.Class(qclass), name, proto, reqLen, hit.DO, hit.UDPSize,
		dns.RcodeToString[rcode], len(reply), fe.cfg.logEvery)
}
