package compactcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// These tests run compactcache the way users run it: in a CoreDNS server
// started from a Corefile (the directive is registered in
// directives_test.go), in front of forward, which asks a DNS server written in
// the test over the loopback network. The server core's ScrubWriter, the
// plugin chain's writers and the real wire are all on the path.

// serverMu serializes caddy.Start and Instance.Stop: caddy keeps
// process-wide state while it parses a Corefile and starts its servers,
// and a stop takes its instance out of the list of instances, which
// lifecycle reads as a block starts (caddy.Instances, without a lock).
var serverMu sync.Mutex

// corefileInput is a Corefile held in memory.
type corefileInput string

func (c corefileInput) Body() []byte       { return []byte(c) }
func (c corefileInput) Path() string       { return "Corefile" }
func (c corefileInput) ServerType() string { return "dns" }

// startCoreDNS starts a CoreDNS instance from corefile, whose server blocks
// should all listen on 127.0.0.1 port 0, and returns the UDP and TCP
// addresses of its first server. The instance stops when the test ends.
func startCoreDNS(t *testing.T, corefile string) (udp, tcp string) {
	t.Helper()
	return serverAddrs(t, startInstance(t, corefile), corefile)
}

// serverAddrs returns the UDP and TCP addresses of inst's first server,
// started from corefile.
func serverAddrs(t *testing.T, inst *caddy.Instance, corefile string) (udp, tcp string) {
	t.Helper()
	srvs := inst.Servers()
	if len(srvs) == 0 {
		t.Fatalf("CoreDNS started no server\nCorefile:\n%s", corefile)
	}
	if a := srvs[0].LocalAddr(); a != nil {
		udp = a.String()
	}
	if a := srvs[0].Addr(); a != nil {
		tcp = a.String()
	}
	if udp == "" || tcp == "" {
		t.Fatalf("CoreDNS server without UDP (%q) or TCP (%q) listener", udp, tcp)
	}
	return udp, tcp
}

// startInstance starts a CoreDNS instance from corefile and returns it; it
// stops when the test ends.
func startInstance(t *testing.T, corefile string) *caddy.Instance {
	t.Helper()
	inst, err := startCorefile(corefile)
	if err != nil {
		t.Fatalf("starting CoreDNS: %v\nCorefile:\n%s", err, corefile)
	}
	t.Cleanup(func() { stopInstance(inst) })
	return inst
}

// stopInstance stops inst: its servers, then its plugins' shutdown
// callbacks, which close what they opened, and what compactcache's blocks
// close with the final ones (a front end's sockets and their readers, an
// admin registration: lifecycle.Stop). Stop alone would leave those running
// for the rest of the test binary. The other final shutdown callbacks are
// not run: they stop what the process shares, such as the prometheus
// plugin's listener, which other tests read.
func stopInstance(inst *caddy.Instance) {
	stopServers(inst)
	for _, shutdown := range inst.OnShutdown {
		shutdown()
	}
	lifecycle.Stop(inst)
}

// stopServers stops inst's servers, as no instance starts (serverMu).
func stopServers(inst *caddy.Instance) {
	serverMu.Lock()
	defer serverMu.Unlock()
	inst.Stop()
}

// startCorefile starts a CoreDNS instance from corefile, whose servers
// bind port 0, and starts it again while one of them shares its UDP port
// (startOnce): binding port 0 anew gives another port.
func startCorefile(corefile string) (*caddy.Instance, error) {
	for try := 1; ; try++ {
		inst, err := startOnce(corefile)
		if !errors.Is(err, errPortShared) || try == 10 {
			return inst, err
		}
	}
}

// errPortShared: a server's UDP port is shared with another socket.
var errPortShared = errors.New("a server's UDP port is shared with another socket")

// startOnce starts a CoreDNS instance from corefile, one start at a time.
// CoreDNS binds with SO_REUSEPORT, so that a server may share its port with
// another test's socket (testenv.UDPSockets): then it stops the instance
// and returns errPortShared.
func startOnce(corefile string) (*caddy.Instance, error) {
	serverMu.Lock()
	caddy.Quiet, dnsserver.Quiet = true, true
	inst, err := caddy.Start(corefileInput(corefile))
	serverMu.Unlock()
	if err != nil {
		return nil, err
	}
	for _, s := range inst.Servers() {
		if a := s.LocalAddr(); a != nil && testenv.UDPSockets(a.String()) > 1 {
			stopInstance(inst)
			return nil, fmt.Errorf("%s: %w", a, errPortShared)
		}
	}
	return inst, nil
}

// startError starts a CoreDNS instance from corefile, which should not
// start, and returns the error it did not start with; nil, the instance
// stopped, when it started.
func startError(corefile string) error {
	inst, err := startCorefile(corefile)
	if err == nil {
		stopInstance(inst)
	}
	return err
}

// startUpstream serves u on 127.0.0.1, UDP and TCP on one port, as a real
// authoritative server would: the reply's OPT echoes the request's and UDP
// replies are truncated to the requester's buffer (512 without EDNS). Queries
// u has no answer for get SERVFAIL. It returns the address.
func startUpstream(t *testing.T, u *upstream) string {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		tw := &truncatingWriter{ResponseWriter: w, req: r}
		if _, err := u.ServeDNS(context.Background(), tw, r); err != nil {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeServerFailure)
			w.WriteMsg(m)
		}
	})
	pc, ln := listenUDPTCP(t)
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		t.Cleanup(func() { s.Shutdown() })
	}
	return pc.LocalAddr().String()
}

// listenUDPTCP listens on an ephemeral port of 127.0.0.1, UDP and TCP.
func listenUDPTCP(t *testing.T) (net.PacketConn, net.Listener) {
	t.Helper()
	// Take an ephemeral UDP port, then the same port for TCP; another
	// process may hold that TCP port, so try a few.
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatal("no port free for both UDP and TCP")
	return nil, nil
}

// freePort returns an address of 127.0.0.1 whose port was free for UDP and
// TCP a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testenv.FreePort(t)))
}

// truncatingWriter makes UDP replies fit the requester's buffer, as a DNS
// server must; the scripted answers may be larger.
type truncatingWriter struct {
	dns.ResponseWriter
	req *dns.Msg
}

func (w *truncatingWriter) WriteMsg(m *dns.Msg) error {
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if o := w.req.IsEdns0(); o != nil {
			size = max(size, int(o.UDPSize()))
		}
		m.Truncate(size)
	}
	return w.ResponseWriter.WriteMsg(m)
}

// exchangeUDP sends m over UDP and returns the reply and its size on the wire.
func exchangeUDP(t *testing.T, addr string, m *dns.Msg) (*dns.Msg, int) {
	t.Helper()
	q, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	r, n := exchangeWire(t, addr, q)
	if r.Id != m.Id {
		t.Fatalf("%s over UDP: reply ID %d, want %d", m.Question[0].String(), r.Id, m.Id)
	}
	return r, n
}

// exchangeWire sends the packed query q over UDP and returns the reply and
// its size on the wire.
func exchangeWire(t *testing.T, addr string, q []byte) (*dns.Msg, int) {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(q); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, dns.MaxMsgSize)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("query over UDP: %v", err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatalf("query over UDP: unpacking the reply: %v", err)
	}
	return r, n
}

// exchangeTCP sends m over TCP and returns the reply.
func exchangeTCP(t *testing.T, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s over TCP: %v", m.Question[0].String(), err)
	}
	return r
}

// cacheCorefile is a Corefile with compactcache, given options, in front
// of forward to up.
func cacheCorefile(up string, options ...string) string {
	block := ""
	if len(options) > 0 {
		block = " {\n\t\t" + strings.Join(options, "\n\t\t") + "\n\t}"
	}
	return `.:0 {
	bind 127.0.0.1
	compactcache` + block + `
	forward . ` + up + `
}`
}

// cacheMode is how clients reach compactcache: through CoreDNS's server
// core, or through the front end, which answers hits itself.
type cacheMode struct {
	name     string
	frontend bool
}

var cacheModes = []cacheMode{{"plugin", false}, {"frontend", true}}

// start starts CoreDNS with compactcache, given options, in front of
// forward to up, and returns where the mode's clients ask.
func (m cacheMode) start(t *testing.T, up string, options ...string) (udp, tcp string) {
	t.Helper()
	if !m.frontend {
		return startCoreDNS(t, cacheCorefile(up, options...))
	}
	fe, _, _ := startFrontend(t, func(fe string) string {
		return cacheCorefile(up, append(options, "frontend "+fe)...)
	})
	return fe, fe
}

// startFrontend starts CoreDNS from the Corefile that corefile makes for a
// front end at fe, a free port, and returns fe and the server's UDP and TCP
// addresses.
func startFrontend(t *testing.T, corefile func(fe string) string) (fe, udp, tcp string) {
	t.Helper()
	fes, inst, text := startFrontends(t, 1, func(fes []string) string { return corefile(fes[0]) })
	udp, tcp = serverAddrs(t, inst, text)
	return fes[0], udp, tcp
}

// startFrontends starts CoreDNS from the Corefile that corefile makes for n
// front ends at fes, ports free on 127.0.0.1 and ::1 (a Corefile may name
// either), and returns fes, the instance, which stops when the test ends,
// and the Corefile. A front end binds its sockets with SO_REUSEPORT too: a
// server of another test that took the port first, after freePort let it
// go, would share it silently; counted (frontendShared), the front ends
// start again elsewhere.
func startFrontends(t *testing.T, n int, corefile func(fes []string) string) ([]string, *caddy.Instance, string) {
	t.Helper()
	fes, inst, text := startOnFreePorts(t, n, corefile, frontendShared)
	t.Cleanup(func() { stopInstance(inst) })
	return fes, inst, text
}

// startOnFreePorts starts CoreDNS from the Corefile that corefile makes for
// n distinct addresses of 127.0.0.1 whose ports were free when chosen, and
// returns them, the instance and the Corefile; the caller stops the
// instance.
// Other ports are tried, up to 10 times, while a socket without SO_REUSEPORT
// (a client's, of another test) holds one, so that a bind fails, or one
// with it shares a server's port (startOnce) or, as shared reports when
// given, one of the addresses.
func startOnFreePorts(t *testing.T, n int, corefile func(addrs []string) string, shared func(addrs []string, corefile string) bool) ([]string, *caddy.Instance, string) {
	t.Helper()
	for try := 1; ; try++ {
		addrs := make([]string, n)
		for i := range addrs {
			addrs[i] = freePort(t)
			for slices.Contains(addrs[:i], addrs[i]) {
				addrs[i] = freePort(t)
			}
		}
		text := corefile(addrs)
		inst, err := startOnce(text)
		if (portTaken(err) || errors.Is(err, errPortShared)) && try < 10 {
			continue
		}
		if err != nil {
			t.Fatalf("starting CoreDNS: %v\nCorefile:\n%s", err, text)
		}
		if shared != nil && shared(addrs, text) && try < 10 {
			stopInstance(inst)
			continue
		}
		return addrs, inst, text
	}
}

// portTaken reports whether err is a failed bind of a port another socket
// holds. Caddy formats its servers' bind errors with %v, which drops the
// errno from the chain, so the errno's text is matched instead.
func portTaken(err error) bool {
	return err != nil && strings.Contains(err.Error(), syscall.EADDRINUSE.Error())
}

// frontendShared reports whether another server's sockets share the port
// of one of the front ends at fes, of the instance started from corefile,
// on 127.0.0.1 or ::1.
func frontendShared(fes []string, corefile string) bool {
	for _, fe := range fes {
		_, port, _ := net.SplitHostPort(fe)
		if testenv.UDPSockets(fe) > frontendSockets(corefile) ||
			testenv.UDPSockets(net.JoinHostPort("::1", port)) > frontendSockets(corefile) {
			return true
		}
	}
	return false
}

// frontendSockets returns the sockets the front end of corefile opens: its
// sockets setting, GOMAXPROCS by default.
func frontendSockets(corefile string) int {
	if m := socketsSetting.FindStringSubmatch(corefile); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return runtime.GOMAXPROCS(0)
}

var socketsSetting = regexp.MustCompile(`\bsockets (\d+)`)

// checkEcho fails unless r echoes the question of req exactly, 0x20 case
// included, and owners that equal the qname in any case are written in the
// client's case.
func checkEcho(t *testing.T, what string, r, req *dns.Msg) {
	t.Helper()
	if len(r.Question) != 1 || r.Question[0] != req.Question[0] {
		t.Errorf("%s: question %v, want %v", what, r.Question, req.Question[0])
	}
	qname := req.Question[0].Name
	for _, rr := range append(append(r.Answer[:len(r.Answer):len(r.Answer)], r.Ns...), r.Extra...) {
		if n := rr.Header().Name; strings.EqualFold(n, qname) && n != qname {
			t.Errorf("%s: owner %q, want the client's %q", what, n, qname)
		}
	}
}

// checkOPT fails unless r has OPT exactly when req has, with DO echoed.
func checkOPT(t *testing.T, what string, r, req *dns.Msg) {
	t.Helper()
	ro, qo := r.IsEdns0(), req.IsEdns0()
	switch {
	case qo == nil && ro != nil:
		t.Errorf("%s: OPT in the reply to a request without EDNS", what)
	case qo != nil && ro == nil:
		t.Errorf("%s: no OPT in the reply to an EDNS request", what)
	case qo != nil && ro.Do() != qo.Do():
		t.Errorf("%s: DO %v in the reply, %v in the request", what, ro.Do(), qo.Do())
	}
}

func TestServerAnswersAsUpstream(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			u := exampleUpstream()
			u.add("mixed.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("mixed.example.org. 300 IN A 192.0.2.33")}, nil, nil)
			udp, tcp := mode.start(t, startUpstream(t, u))

			cases := []struct {
				name  string
				qtype uint16
				do    bool
				edns  bool
			}{
				{"a.example.org.", dns.TypeA, false, false},
				{"a.example.org.", dns.TypeAAAA, false, true},
				{"t.example.org.", dns.TypeTXT, false, false},
				{"www.example.org.", dns.TypeA, false, false}, // CNAME chain
				{"example.org.", dns.TypeMX, false, false},
				{"example.org.", dns.TypeNS, false, true},
				{"_sip._udp.example.org.", dns.TypeSRV, false, false},
				{"example.org.", dns.TypeSOA, false, false},
				{"1.2.0.192.in-addr.arpa.", dns.TypePTR, false, false},
				{"missing.example.org.", dns.TypeA, false, false}, // NXDOMAIN
				{"a.example.org.", dns.TypeMX, false, true},       // NODATA
				{"A.Example.ORG.", dns.TypeA, false, false},       // 0x20 on a cached name
				{"MiXeD.ExAmPlE.oRg.", dns.TypeA, false, false},   // 0x20 on a miss
				{"mixed.EXAMPLE.org.", dns.TypeA, false, true},    // and another case on the hit
				{"WWW.example.org.", dns.TypeA, true, true},
			}
			for _, tc := range cases {
				req := test.Case{Qname: tc.name, Qtype: tc.qtype, Do: tc.do}.Msg()
				if tc.edns && !tc.do {
					req.SetEdns0(1232, false)
				}
				want := u.script(tc.name, tc.qtype)(req)
				what := tc.name + "/" + dns.TypeToString[tc.qtype]
				for i := range 3 {
					var got *dns.Msg
					if i < 2 {
						got, _ = exchangeUDP(t, udp, req)
					} else {
						got = exchangeTCP(t, tcp, req)
					}
					w := what + " query " + strconv.Itoa(i)
					if err := sameReply(got, want); err != nil {
						t.Errorf("%s: %v", w, err)
					}
					checkEcho(t, w, got, req)
					checkOPT(t, w, got, req)
				}
				if n := u.count(tc.name, tc.qtype); n != 1 {
					t.Errorf("%s: upstream asked %d times, want 1", what, n)
				}
			}
		})
	}
}

func TestServerLargeAnswers(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream()
			// About 2.2 KB: more than 512, more than the cache's own 1232-byte
			// buffer, less than 4096.
			u.add("big.example.org.", dns.TypeTXT, dns.RcodeSuccess, bigTXT("big.example.org.", 20), nil, nil)
			// About 900 bytes: more than 512, less than 1232.
			u.add("medium.example.org.", dns.TypeTXT, dns.RcodeSuccess, bigTXT("medium.example.org.", 8), nil, nil)
			// The same 2.2 KB under another name, asked first without EDNS.
			u.add("huge.example.org.", dns.TypeTXT, dns.RcodeSuccess, bigTXT("huge.example.org.", 20), nil, nil)
			udp, tcp := mode.start(t, startUpstream(t, u))

			plain := func(name string) *dns.Msg { return test.Case{Qname: name, Qtype: dns.TypeTXT}.Msg() }
			withEDNS := func(name string, size uint16) *dns.Msg {
				m := plain(name)
				m.SetEdns0(size, false)
				return m
			}
			whole := func(what string, got, req *dns.Msg, u *upstream) {
				t.Helper()
				want := u.script(req.Question[0].Name, dns.TypeTXT)(req)
				if err := sameReply(got, want); err != nil {
					t.Errorf("%s: %v", what, err)
				}
				checkEcho(t, what, got, req)
				checkOPT(t, what, got, req)
			}
			truncated := func(what string, got *dns.Msg, size, limit int, req *dns.Msg) {
				t.Helper()
				if !got.Truncated || size > limit || got.Rcode != dns.RcodeSuccess {
					t.Errorf("%s: TC=%v, %d bytes, rcode %s; want TC, at most %d bytes, NOERROR",
						what, got.Truncated, size, dns.RcodeToString[got.Rcode], limit)
				}
				checkEcho(t, what, got, req)
				checkOPT(t, what, got, req)
			}

			// big: first over UDP with a 4096-byte buffer (a miss, answered whole),
			// then from the cache: whole again, cut with TC for a client without
			// EDNS and one with 1232 bytes, and whole over TCP.
			req := withEDNS("big.example.org.", 4096)
			for i := range 2 {
				got, n := exchangeUDP(t, udp, req)
				if n <= 1232 {
					t.Errorf("big over UDP/4096 query %d: %d bytes, want the whole answer (> 1232)", i, n)
				}
				whole("big over UDP/4096 query "+strconv.Itoa(i), got, req, u)
			}
			req = plain("big.example.org.")
			got, n := exchangeUDP(t, udp, req)
			truncated("big over UDP without EDNS", got, n, dns.MinMsgSize, req)
			req = withEDNS("big.example.org.", 1232)
			got, n = exchangeUDP(t, udp, req)
			truncated("big over UDP/1232", got, n, 1232, req)
			for _, req := range []*dns.Msg{plain("big.example.org."), withEDNS("Big.Example.Org.", 1232)} {
				whole("big over TCP", exchangeTCP(t, tcp, req), req, u)
			}
			if c := u.count("big.example.org.", dns.TypeTXT); c != 1 {
				t.Errorf("big: upstream asked %d times, want 1", c)
			}

			// medium: first without EDNS. The cache asks with its own 1232-byte
			// buffer, so the whole answer comes back and is stored; the client gets
			// TC, a TCP retry gets the whole answer from the cache.
			req = plain("medium.example.org.")
			for i := range 2 {
				got, n := exchangeUDP(t, udp, req)
				truncated("medium over UDP without EDNS query "+strconv.Itoa(i), got, n, dns.MinMsgSize, req)
			}
			whole("medium over TCP", exchangeTCP(t, tcp, req), req, u)
			req = withEDNS("medium.example.org.", 1232)
			got, n = exchangeUDP(t, udp, req)
			if n > 1232 {
				t.Errorf("medium over UDP/1232: %d bytes", n)
			}
			whole("medium over UDP/1232", got, req, u)
			if c := u.count("medium.example.org.", dns.TypeTXT); c != 1 {
				t.Errorf("medium: upstream asked %d times, want 1", c)
			}

			// huge: first without EDNS. Even the cache's 1232 bytes are too few:
			// the upstream truncates, the cache asks again over TCP (miss.go) and
			// stores the whole answer; the client gets TC, its TCP retry and every
			// later query are hits.
			req = plain("huge.example.org.")
			got, n = exchangeUDP(t, udp, req)
			truncated("huge over UDP without EDNS", got, n, dns.MinMsgSize, req)
			if c := u.count("huge.example.org.", dns.TypeTXT); c != 2 {
				t.Errorf("huge: upstream asked %d times, want 2 (UDP, truncated, then TCP)", c)
			}
			for i := range 2 {
				whole("huge over TCP query "+strconv.Itoa(i), exchangeTCP(t, tcp, req), req, u)
			}
			got, n = exchangeUDP(t, udp, req)
			truncated("huge over UDP without EDNS, cached", got, n, dns.MinMsgSize, req)
			req = withEDNS("huge.example.org.", 4096)
			got, _ = exchangeUDP(t, udp, req)
			whole("huge over UDP/4096", got, req, u)
			if c := u.count("huge.example.org.", dns.TypeTXT); c != 2 {
				t.Errorf("huge: upstream asked %d times, want 2", c)
			}
		})
	}
}

// TestServerTTLAging checks aging on the real clock; cache_test.go covers
// it in detail with a fake one.
func TestServerTTLAging(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			u := exampleUpstream()
			udp, _ := mode.start(t, startUpstream(t, u))
			req := test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()
			first, _ := exchangeUDP(t, udp, req)
			time.Sleep(1100 * time.Millisecond)
			second, _ := exchangeUDP(t, udp, req)
			if len(first.Answer) != 3 || len(second.Answer) != 3 {
				t.Fatalf("answers: %v then %v", first.Answer, second.Answer)
			}
			for i, rr := range second.Answer {
				if was := first.Answer[i].Header().Ttl; rr.Header().Ttl >= was {
					t.Errorf("%s: TTL %d a second after %d", rr, rr.Header().Ttl, was)
				}
			}
			if n := u.count("www.example.org.", dns.TypeA); n != 1 {
				t.Errorf("upstream asked %d times, want 1", n)
			}
		})
	}
}

// TestPortTaken: starting CoreDNS on a port another socket holds fails
// with an error portTaken knows, for a server's port and a front end's, so
// that startOnFreePorts tries other ports.
func TestPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	_, port, _ := net.SplitHostPort(taken)
	for _, tc := range []struct{ name, corefile string }{
		{"server", ".:" + port + " {\n\tbind 127.0.0.1\n\twhoami\n}"},
		{"frontend", ".:0 {\n\tbind 127.0.0.1\n\tcompactcache {\n\t\tfrontend " + taken + "\n\t}\n\twhoami\n}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, err := startOnce(tc.corefile)
			if err == nil {
				stopInstance(inst)
				t.Fatalf("started on %s, which another socket holds", taken)
			}
			if !portTaken(err) {
				t.Fatalf("portTaken(%q) = false", err)
			}
		})
	}
	if portTaken(errPortShared) || portTaken(nil) {
		t.Fatal("portTaken holds for other errors")
	}
}
