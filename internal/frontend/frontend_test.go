package frontend

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// cannedCache answers every request with one reply, as a cache with an
// entry for it would: the front end's own work is what the tests that use
// it count (the plugin's tests count the cache's: TestPacketAnswerAsPlugin).
type cannedCache struct{ reply []byte }

func (c cannedCache) Answerer(string) Answerer { return cannedAnswerer(c) }
func (c cannedCache) Counters(string) Counters {
	return Counters{Hit: prometheus.NewCounter(prometheus.CounterOpts{Name: "hit"}), Chain: prometheus.NewCounter(prometheus.CounterOpts{Name: "chain"}),
		Shed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shed"}), Dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})}
}

type cannedAnswerer cannedCache

func (a cannedAnswerer) Answer(pkt []byte, _ netip.Addr, _ bool, _ time.Time, _ *Hit) []byte {
	copy(a.reply, pkt[:2]) // the request's ID, as a real answer has it
	return a.reply
}

func TestParse(t *testing.T) {
	tests := []struct {
		input string
		check func(*Config) bool
	}{
		{"frontend 127.0.0.1:53", func(f *Config) bool {
			return strings.Join(f.udp, ",") == "127.0.0.1:53" && strings.Join(f.tcp, ",") == "127.0.0.1:53" &&
				f.sockets >= 1 && f.inflight == defaultInflight && f.logEvery == 0 && !f.poller
		}},
		{"frontend 127.0.0.1:53 {\n wait poller\n }", func(f *Config) bool { return f.poller }},
		{"frontend 127.0.0.1:53 {\n wait thread\n }", func(f *Config) bool { return !f.poller }},
		{"frontend 127.0.0.1:53 {\n coalesce 200us\n }", func(f *Config) bool { return f.coalesce == 200*time.Microsecond && !f.poller }},
		{"frontend 127.0.0.1:53 {\n wait poller\n coalesce 0s\n }", func(f *Config) bool { return f.coalesce == 0 && f.poller }},
		{"frontend udp://[::1]:53 tcp://127.0.0.1:53 dns://:5353 {\n sockets 4\n inflight 10\n log 100\n }", func(f *Config) bool {
			return strings.Join(f.udp, ",") == "[::1]:53,:5353" && strings.Join(f.tcp, ",") == "127.0.0.1:53,:5353" &&
				f.sockets == 4 && f.inflight == 10 && f.logEvery == 100
		}},
	}
	for _, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		c.Next()
		f, err := Parse(c, c.RemainingArgs())
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if !tc.check(f) {
			t.Errorf("%q: parsed as %+v", tc.input, *f)
		}
	}
}

// TestParseRefuses: a bad option is refused at startup, naming it.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ input, want string }{
		{"frontend 127.0.0.1:53 {\n coalesce\n }", "frontend coalesce: want one duration"},
		{"frontend 127.0.0.1:53 {\n coalesce 1ms 2ms\n }", "frontend coalesce: want one duration"},
		{"frontend 127.0.0.1:53 {\n coalesce soon\n }", "frontend coalesce: want one duration"},
		{"frontend 127.0.0.1:53 {\n coalesce -1ms\n }", "frontend coalesce: want one duration"},
		{"frontend 127.0.0.1:53 {\n coalesce 1001us\n }", "frontend coalesce: want one duration"},
		{"frontend 127.0.0.1:53 {\n wait poller\n coalesce 100us\n }", "frontend coalesce: wants wait thread"},
		{"frontend 127.0.0.1:53 {\n wait sometimes\n }", "frontend wait: want thread or poller"},
		{"frontend 127.0.0.1:53 {\n sockets 0\n }", "frontend sockets: \"0\" is not a number of at least 1"},
		{"frontend 127.0.0.1", "frontend: \"127.0.0.1\" is not HOST:PORT"},
	} {
		c := caddy.NewTestController("dns", tc.input)
		c.Next()
		_, err := Parse(c, c.RemainingArgs())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one with %q", tc.input, err, tc.want)
		}
	}
}

// TestLimitsOf: the front end's TCP connections get the server's limits,
// CoreDNS's defaults included, and miekg/dns's where a server leaves one
// unset.
func TestLimitsOf(t *testing.T) {
	defaults, err := dnsserver.NewServer("dns://127.0.0.1:53", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		srv  *dnsserver.Server
		want tcpLimits
	}{
		{"CoreDNS's defaults", defaults, tcpLimits{read: 3 * time.Second, idle: 10 * time.Second, write: 5 * time.Second, queries: -1}},
		{"timeouts", &dnsserver.Server{ReadTimeout: time.Second, IdleTimeout: time.Minute, WriteTimeout: 20 * time.Second, MaxTCPQueries: 2}, tcpLimits{read: time.Second, idle: time.Minute, write: 20 * time.Second, queries: 2}},
		{"unset", &dnsserver.Server{}, tcpLimits{read: 2 * time.Second, idle: 8 * time.Second, write: 2 * time.Second, queries: 128}},
	} {
		if got := limitsOf(tc.srv); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestShedReply: a shed request gets the reply CoreDNS's server gives its
// own errors (errorFunc): SERVFAIL with the request's ID, flags and
// question, and with EDNS an OPT record of the request's UDP size and DO
// bit, version 0 (RFC 6891 6.1.1); an OPT record was missing.
func TestShedReply(t *testing.T) {
	q := func(edit func(m *dns.Msg)) *dns.Msg {
		m := new(dns.Msg).SetQuestion("www.example.org.", dns.TypeA)
		m.Id, m.CheckingDisabled = 4242, true
		if edit != nil {
			edit(m)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		req  *dns.Msg
	}{
		{"no EDNS", q(nil)},
		{"EDNS", q(func(m *dns.Msg) { m.SetEdns0(1232, false) })},
		{"EDNS with DO", q(func(m *dns.Msg) { m.SetEdns0(4096, true) })},
		{"EDNS version 1, options", q(func(m *dns.Msg) {
			m.SetEdns0(1400, true)
			m.IsEdns0().SetVersion(1)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}}
		})},
		{"EDNS after TSIG's owner, compressed", q(func(m *dns.Msg) {
			m.Extra = append(m.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: "www.example.org.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"x"}})
			m.SetEdns0(1232, true)
			m.Compress = true
		})},
		{"OPT outside the additional section", q(func(m *dns.Msg) {
			m.Ns = []dns.RR{&dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}}
		})},
	} {
		pkt, err := tc.req.Pack()
		if err != nil {
			t.Fatal(err)
		}
		want := new(dns.Msg).SetRcode(tc.req, dns.RcodeServerFailure)
		want.RecursionDesired, want.CheckingDisabled = tc.req.RecursionDesired, tc.req.CheckingDisabled
		if o := tc.req.IsEdns0(); o != nil {
			want.SetEdns0(o.UDPSize(), o.Do())
		}
		got := new(dns.Msg)
		if err := got.Unpack(shedReply(pkt)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got.String() != want.String() {
			t.Errorf("%s: reply\n%s\nwant\n%s", tc.name, got, want)
		}
	}
	resp := q(nil)
	resp.Response = true
	for name, req := range map[string]*dns.Msg{"reply": resp} {
		pkt, _ := req.Pack()
		if got := shedReply(pkt); got != nil {
			t.Errorf("%s: shed reply %v, want none", name, got)
		}
	}
	if got := shedReply([]byte{1, 2, 3}); got != nil {
		t.Errorf("runt: shed reply %v, want none", got)
	}
}

// TestSuccessor: a closed front end's replies leave through the newest
// front end opened after it with a socket on the same address, never
// through an older one, which may be closing too.
func TestSuccessor(t *testing.T) {
	local := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353}
	other := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5354}
	var fes [3]*frontend
	for i := range fes {
		fes[i] = &frontend{seq: frontends.Add(1)}
		recordSocket(fes[i], local, pollerConn{new(net.UDPConn)})
	}
	recordSocket(fes[0], other, pollerConn{new(net.UDPConn)})
	t.Cleanup(func() {
		for _, fe := range fes {
			forgetSockets(fe)
		}
	})
	sender := func(fe *frontend) udpSender {
		successors.Lock()
		defer successors.Unlock()
		for _, o := range successors.m[socketKey(local)] {
			if o.fe == fe {
				return o.s
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name   string
		forget *frontend
		of     *frontend
		want   *frontend
	}{
		{"the newest", nil, fes[0], fes[2]},
		{"the newest of a later one", nil, fes[1], fes[2]},
		{"none for the newest", nil, fes[2], nil},
		{"the next newest once the newest closed", fes[2], fes[0], fes[1]},
		{"none for a later one", nil, fes[1], nil},
		{"never an older one, once its own are forgotten", fes[1], fes[1], nil},
	} {
		if tc.forget != nil {
			forgetSockets(tc.forget)
		}
		want := udpSender(nil)
		if tc.want != nil {
			want = sender(tc.want)
		}
		if got, _ := successor(tc.of, local); got.s != want {
			t.Errorf("%s: got a socket of %v, want %v", tc.name, got, want)
		}
	}
	recordSocket(fes[2], &net.TCPAddr{IP: other.IP, Port: other.Port}, nil)
	if _, ok := successor(fes[0], other); ok {
		t.Error("a successor on an address no later front end has UDP sockets on")
	}
}

// TestRejectsAsServer: a request the server rejects gets the reply
// CoreDNS's server gives it (acceptMessage): an opcode no plugin allows,
// NOTIMP; an allowed opcode other than QUERY or NOTIFY, but for a number
// of questions other than one, FORMERR. The latter got NOTIMP.
func TestRejectsAsServer(t *testing.T) {
	fe := &frontend{blocks: []*block{{fm: cannedCache{}.Counters("")}}}
	fe.opcodes[dns.OpcodeUpdate] = true
	for _, tc := range []struct {
		name      string
		opcode    int
		questions int
		want      int
	}{
		{"allowed, no question", dns.OpcodeUpdate, 0, dns.RcodeFormatError},
		{"allowed, two questions", dns.OpcodeUpdate, 2, dns.RcodeFormatError},
		{"not allowed", dns.OpcodeStatus, 1, dns.RcodeNotImplemented},
	} {
		m := new(dns.Msg)
		m.Id, m.Opcode = 4242, tc.opcode
		for i := range tc.questions {
			m.Question = append(m.Question, dns.Question{Name: fmt.Sprintf("q%d.example.org.", i), Qtype: dns.TypeSOA, Qclass: dns.ClassINET})
		}
		pkt, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		client, server := net.Pipe()
		go fe.serveChain(pkt, &chainWriter{tcp: &tcpConn{conn: server, timeout: 5 * time.Second}})
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		var size [2]byte
		if _, err := io.ReadFull(client, size[:]); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		reply := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(client, reply); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		client.Close()
		got := new(dns.Msg)
		if err := got.Unpack(reply); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.Rcode != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, dns.RcodeToString[got.Rcode], dns.RcodeToString[tc.want])
		}
	}
}

// TestBlockOf: a request goes to the block the server would give it: the
// longest zone that holds its name, for DS the shortest but the root, and
// none (the chain) when that zone is of a block without the front end.
func TestBlockOf(t *testing.T) {
	wire := func(s string) []byte {
		b := make([]byte, 256)
		n, err := dns.PackDomainName(s, b, 0, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		return b[:n]
	}
	fe := &frontend{
		blocks: []*block{{zones: [][]byte{wire(".")}}, {zones: [][]byte{wire("a.test.")}}, {zones: [][]byte{wire("b.a.test.")}}},
		others: [][]byte{wire("c.b.a.test.")},
	}
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  int
	}{
		{"x.other.", dns.TypeA, 0},
		{"x.A.test.", dns.TypeA, 1},
		{"x.b.a.TEST.", dns.TypeA, 2},
		{"x.c.b.a.test.", dns.TypeA, -1},
		{"x.b.a.test.", dns.TypeDS, 1},
		{"x.c.b.a.test.", dns.TypeDS, 1},
		{"x.other.", dns.TypeDS, 0},
	} {
		pkt, err := new(dns.Msg).SetQuestion(tc.name, tc.qtype).Pack()
		if err != nil {
			t.Fatal(err)
		}
		if got := fe.blockOf(pkt); got != tc.want {
			t.Errorf("%s %s: block %d, want %d", tc.name, dns.TypeToString[tc.qtype], got, tc.want)
		}
	}
}
