package frontend

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	corelog "github.com/coredns/coredns/plugin/log"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	clog "github.com/coredns/coredns/plugin/pkg/log"
	"github.com/coredns/coredns/plugin/pkg/replacer"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// A hit the front end answers never reaches the log plugin either. With
// `log` before the cache, accessLog logs each hit as that plugin logs a
// request of the chain: the first rule whose zone holds the name, its class
// filter, its format, written by CoreDNS's own replacer. The line is made
// and written off the socket loop: the loop copies what the line needs into
// a slot of a bounded queue, a goroutine of the front end's writes it, and
// a line that finds the queue full is counted and said in the log, since a
// log that cannot keep up must not slow answers down.

const (
	// accessQueue is how many hits wait for their line at most.
	accessQueue = 4096
	// maxLoggedRequest is the longest request a queue slot holds; a longer
	// one, padded (RFC 7830) or over TCP, is copied apart. Requests are
	// seldom past 100 bytes.
	maxLoggedRequest = 512
	// dropReport is how often a count of dropped lines is logged.
	dropReport = 10 * time.Second
)

// accessLog logs the front end's hits for the block's log plugin.
type accessLog struct {
	rules   []corelog.Rule
	lines   chan accessRecord
	dropped atomic.Int64
	counter prometheus.Counter // the dropped lines, in the front end's requests by result
	stop    chan struct{}      // closed by close
	done    chan struct{}      // closed by the writer as it leaves
}

// accessRecord is what the line of one hit needs, copied off the packet
// and the reply so that the socket's buffers can take the next batch.
type accessRecord struct {
	req           [maxLoggedRequest]byte
	reqLen        int
	long          []byte                 // the request, when past maxLoggedRequest
	udpSize       uint16                 // the request's EDNS buffer size, as bufsize left it
	header        [dnsmsg.HeaderLen]byte // the reply's, for its rcode and flags
	replyLen      int
	class         response.Class
	local, remote netip.AddrPort
	tcp           bool
	took          time.Duration
}

// blockLog returns the log plugin of the block of cfg when it stands before
// the cache, the plugin named cache; ok is false when it logs in a way the
// front end cannot reproduce (metadata placeholders, JSON output), so that
// hits must go to the chain.
func blockLog(cfg *dnsserver.Config, cache string) (l *corelog.Logger, ok bool) {
	for _, h := range cfg.Handlers() {
		if h.Name() == cache {
			return nil, true
		}
		lg, isLog := h.(corelog.Logger)
		if !isLog {
			continue
		}
		if clog.IsJSON() {
			return nil, false
		}
		for _, r := range lg.Rules {
			if strings.Contains(r.Format, "{/") {
				return nil, false
			}
		}
		return &lg, true
	}
	return nil, true
}

// newAccessLog starts the goroutine that writes l's lines; dropped counts
// the lines it could not take.
func newAccessLog(l *corelog.Logger, dropped prometheus.Counter) *accessLog {
	a := &accessLog{rules: l.Rules, lines: make(chan accessRecord, accessQueue), counter: dropped, stop: make(chan struct{}), done: make(chan struct{})}
	go a.write()
	return a
}

// hit queues the line of the hit that answered the request pkt with reply.
func (a *accessLog) hit(pkt, reply []byte, local, remote netip.AddrPort, tcp bool, hit *Hit, took time.Duration) {
	if a == nil {
		return
	}
	r := accessRecord{reqLen: len(pkt), replyLen: len(reply), udpSize: hit.UDPSize, class: hit.Class, local: local, remote: remote, tcp: tcp, took: took}
	if len(pkt) > maxLoggedRequest {
		r.long = append([]byte(nil), pkt...)
	} else {
		copy(r.req[:], pkt)
	}
	copy(r.header[:], reply)
	select {
	case a.lines <- r:
	default:
		a.drop()
	}
}

func (a *accessLog) drop() {
	a.dropped.Add(1)
	a.counter.Inc()
}

// close ends the writer once it has written the queued lines. The queue
// itself stays open: a reader the front end gave up waiting for (a client
// that does not read its reply) may still queue a hit's line, which must
// not panic as a send on a closed channel would.
func (a *accessLog) close() {
	if a == nil {
		return
	}
	close(a.stop)
	<-a.done
}

// write writes the queued lines, and every dropReport how many it dropped.
func (a *accessLog) write() {
	defer close(a.done)
	repl := replacer.New()
	tick := time.NewTicker(dropReport)
	defer tick.Stop()
	for {
		select {
		case r := <-a.lines:
			a.line(repl, &r)
		case <-tick.C:
			a.reportDropped()
		case <-a.stop:
			for {
				select {
				case r := <-a.lines:
					a.line(repl, &r)
				default:
					a.reportDropped()
					return
				}
			}
		}
	}
}

func (a *accessLog) reportDropped() {
	if n := a.dropped.Swap(0); n > 0 {
		log.Warningf("frontend: %d access log lines of hits dropped: the log did not keep up with the front end", n)
	}
}

// line logs r as the log plugin's ServeDNS would have logged its request.
func (a *accessLog) line(repl replacer.Replacer, r *accessRecord) {
	pkt := r.long
	if pkt == nil {
		pkt = r.req[:r.reqLen]
	}
	req := new(dns.Msg)
	if err := req.Unpack(pkt); err != nil {
		return // the front end answered it: it unpacks
	}
	if o := req.IsEdns0(); o != nil {
		// The log plugin sees the request as bufsize, before it, clamped
		// it; the cache's answer did too.
		o.SetUDPSize(r.udpSize)
	}
	state := request.Request{W: &recordWriter{r}, Req: req}
	name := state.Name()
	for _, rule := range a.rules {
		if !plugin.Name(rule.NameScope).Matches(name) {
			continue
		}
		_, all := rule.Class[response.All]
		_, class := rule.Class[r.class]
		if !all && !class {
			return
		}
		reply := new(dns.Msg)
		reply.MsgHdr = header(r.header[:])
		rec := &dnstest.Recorder{Msg: reply, Rcode: reply.Rcode, Len: r.replyLen, Start: time.Now().Add(-r.took)}
		clog.Info(repl.Replace(context.Background(), state, rec, rule.Format))
		return
	}
}

// header returns the header of a message whose first bytes are b.
func header(b []byte) dns.MsgHdr {
	bits := uint16(b[2])<<8 | uint16(b[3])
	return dns.MsgHdr{
		Id:                 uint16(b[0])<<8 | uint16(b[1]),
		Response:           bits&dnsmsg.QR != 0,
		Opcode:             int(bits>>11) & 0xF,
		Authoritative:      bits&dnsmsg.AA != 0,
		Truncated:          bits&dnsmsg.TC != 0,
		RecursionDesired:   bits&dnsmsg.RD != 0,
		RecursionAvailable: bits&dnsmsg.RA != 0,
		AuthenticatedData:  bits&dnsmsg.AD != 0,
		CheckingDisabled:   bits&dnsmsg.CD != 0,
		Rcode:              int(bits & 0xF),
	}
}

// recordWriter is the ResponseWriter a logged hit's request.Request reads
// its addresses and transport from.
type recordWriter struct{ r *accessRecord }

func (w *recordWriter) LocalAddr() net.Addr {
	if w.r.tcp {
		return net.TCPAddrFromAddrPort(w.r.local)
	}
	return net.UDPAddrFromAddrPort(w.r.local)
}

func (w *recordWriter) RemoteAddr() net.Addr {
	if w.r.tcp {
		return net.TCPAddrFromAddrPort(w.r.remote)
	}
	return net.UDPAddrFromAddrPort(w.r.remote)
}

func (w *recordWriter) WriteMsg(*dns.Msg) error     { return nil }
func (w *recordWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *recordWriter) Close() error                { return nil }
func (w *recordWriter) TsigStatus() error           { return nil }
func (w *recordWriter) TsigTimersOnly(bool)         {}
func (w *recordWriter) Hijack()                     {}
