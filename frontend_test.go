//go:build linux

package compactcache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"
	_ "github.com/coredns/coredns/plugin/timeouts" // for TestFrontendTCPTimeouts
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The server tests (server_test.go) and the DNSSEC test through CoreDNS run
// in both modes, plugin and front end. The tests here cover what only the
// front end does: answering hits itself, byte for byte as the plugin does,
// handing the rest to the server block, refusing blocks it would weaken,
// and shedding load.

// frontendHits returns the front end's hits of blocks of zone since
// before, once they reach want or two seconds pass: a hit is counted after
// its reply is sent, and its client may read the reply first.
func frontendHits(zone string, before, want float64) float64 {
	got := frontendCount(zone, "hit") - before
	for deadline := time.Now().Add(2 * time.Second); got < want && time.Now().Before(deadline); got = frontendCount(zone, "hit") - before {
		time.Sleep(time.Millisecond)
	}
	return got
}

// frontendCount returns the front end's request counter for result, in
// blocks of zone.
func frontendCount(zone, result string) float64 {
	c := (&cachemetrics.Block{Zones: zone}).Frontend("dns://127.0.0.1:0")
	return testutil.ToFloat64(map[string]prometheus.Counter{"hit": c.Hit, "chain": c.Chain, "shed": c.Shed, "dropped": c.Dropped}[result])
}

// exchangeRaw sends pkt over UDP and returns the reply, or nil when none
// comes within wait.
func exchangeRaw(t *testing.T, addr string, pkt []byte, wait time.Duration) []byte {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wait))
	if _, err := conn.Write(pkt); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, dns.MaxMsgSize)
	n, err := conn.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// TestFrontendServesHitsItself counts what the front end did: the first
// query of a name goes through the chain, the next ones are its own hits,
// counted as hits of the cache too.
func TestFrontendServesHitsItself(t *testing.T) {
	const zone = "hits.frontend.test."
	u := upstreamOfA(zone)
	up := startUpstream(t, u)
	fe, _, _ := startFrontend(t, func(fe string) string {
		return zone + `:0 {
	bind 127.0.0.1
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + `
}`
	})
	hits, chain := frontendCount(zone, "hit"), frontendCount(zone, "chain")
	successHits := func() float64 {
		return seriesValue(t, "coredns_compactcache_hits_total", map[string]string{"server": "dns://127.0.0.1:0", "type": "success", "zones": zone, "view": ""})
	}
	before := successHits()
	req := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
	for range 5 {
		if r, _ := exchangeUDP(t, fe, req); len(r.Answer) != 1 {
			t.Fatalf("answer %v", r.Answer)
		}
	}
	if got := frontendCount(zone, "chain") - chain; got != 1 {
		t.Errorf("%v requests through the chain, want 1 (the miss)", got)
	}
	if got := frontendHits(zone, hits, 4); got != 4 {
		t.Errorf("%v front end hits, want 4", got)
	}
	if got := successHits() - before; got != 4 {
		t.Errorf("%v cache hits counted, want 4", got)
	}
	if n := u.count("a."+zone, dns.TypeA); n != 1 {
		t.Errorf("upstream asked %d times, want 1", n)
	}
}

// TestFrontendRepliesAsServer sends the same requests to the server's own
// listener and to the front end of one instance, after both saw them once:
// hits must be the same bytes, and requests the front end leaves to the
// chain (other opcodes, several questions, CH class, EDNS version 1, TSIG,
// ECS, malformed) must get the server's reply. Both ways of waiting for
// datagrams read and write the same batches.
func TestFrontendRepliesAsServer(t *testing.T) {
	t.Parallel()
	for _, wait := range []string{"thread", "poller"} {
		t.Run(wait, func(t *testing.T) { testFrontendRepliesAsServer(t, wait) })
	}
}

func testFrontendRepliesAsServer(t *testing.T, wait string) {
	u := exampleUpstream()
	up := startUpstream(t, u)
	fe, udp, _ := startFrontend(t, func(fe string) string {
		return cacheCorefile(up, "frontend "+fe+" {\n\t\t\twait "+wait+"\n\t\t}")
	})

	msg := func(name string, qtype uint16, edit func(m *dns.Msg)) []byte {
		m := test.Case{Qname: name, Qtype: qtype}.Msg()
		m.Id = 4242
		if edit != nil {
			edit(m)
		}
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	edns := func(size uint16, do bool) func(*dns.Msg) {
		return func(m *dns.Msg) { m.SetEdns0(size, do) }
	}
	subnet := func(addr string, source uint8) func(*dns.Msg) {
		return func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			ip := net.ParseIP(addr)
			family := uint16(dnsmsg.FamilyIPv6)
			if ip.To4() != nil {
				family, ip = dnsmsg.FamilyIPv4, ip.To4()
			}
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: family, SourceNetmask: source, Address: ip})
		}
	}
	option := func(o dns.EDNS0) func(*dns.Msg) {
		return func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = append(m.IsEdns0().Option, o)
		}
	}
	edit := func(b []byte, f func([]byte) []byte) []byte { return f(b) }
	opt := []byte{0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 0} // EDNS0, 1232 bytes
	cases := []struct {
		name string
		pkt  []byte
	}{
		{"A", msg("a.example.org.", dns.TypeA, nil)},
		{"0x20", msg("A.ExAmple.ORG.", dns.TypeA, nil)},
		{"CNAME chain, DO", msg("www.example.org.", dns.TypeA, edns(1232, true))},
		{"MX with additional", msg("example.org.", dns.TypeMX, edns(4096, false))},
		{"NXDOMAIN", msg("missing.example.org.", dns.TypeA, nil)},
		{"NODATA", msg("a.example.org.", dns.TypeMX, edns(512, false))},
		{"ECS /24", msg("a.example.org.", dns.TypeA, subnet("198.51.100.7", 24))},
		{"ECS /0", msg("a.example.org.", dns.TypeA, subnet("0.0.0.0", 0))},
		{"ECS v6 /56", msg("a.example.org.", dns.TypeAAAA, subnet("2001:db8:1:2::", 56))},
		{"ECS with host bits", msg("a.example.org.", dns.TypeA, subnet("198.51.100.7", 16))},
		{"COOKIE", msg("a.example.org.", dns.TypeA, option(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}))},
		{"LLQ, malformed", msg("a.example.org.", dns.TypeA, option(&dns.EDNS0_LOCAL{Code: dns.EDNS0LLQ, Data: []byte{1, 2, 3, 4}}))},
		{"NOTIFY", msg("example.org.", dns.TypeSOA, func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify })},
		{"UPDATE", msg("example.org.", dns.TypeSOA, func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate })},
		{"two questions", msg("a.example.org.", dns.TypeA, func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) })},
		{"class CH", msg("version.bind.", dns.TypeTXT, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS })},
		{"EDNS version 1", msg("a.example.org.", dns.TypeA, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) })},
		{"TSIG, unknown key", msg("a.example.org.", dns.TypeA, func(m *dns.Msg) { m.SetTsig("key.", dns.HmacSHA256, 300, time.Now().Unix()) })},
		{"header only", msg("a.example.org.", dns.TypeA, nil)[:dnsmsg.HeaderLen]},
		{"unknown option", msg("a.example.org.", dns.TypeA, option(&dns.EDNS0_LOCAL{Code: 65001, Data: []byte{1}}))},
		{"padding", msg("a.example.org.", dns.TypeA, option(&dns.EDNS0_PADDING{Padding: make([]byte, 40)}))},
		{"NSID", msg("a.example.org.", dns.TypeA, option(&dns.EDNS0_NSID{Code: dns.EDNS0NSID}))},
		{"two OPT", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[11] = 2; return append(append(b, opt...), opt...) })},
		{"OPT in answer", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[7] = 1; return append(b, opt...) })},
		{"OPT not of the root", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[11] = 1; return append(append(b, 1, 'x'), opt[1:]...) })},
		{"TC", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[2] |= 2; return b })},
		{"RD=0", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[2] &^= 1; return b })},
		{"no question", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[5] = 0; return b })},
		{"class ANY", msg("a.example.org.", dns.TypeA, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassANY })},
		{"class NONE", msg("a.example.org.", dns.TypeA, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassNONE })},
		{"IQUERY", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { b[2] |= 1 << 3; return b })},
		{"trailing garbage", append(msg("a.example.org.", dns.TypeA, nil), 0xde, 0xad)},
		{"EDNS size 100", msg("example.org.", dns.TypeMX, edns(100, false))},
		{"compressed question", edit(msg("a.example.org.", dns.TypeA, nil), func(b []byte) []byte { return append(append(b[:12:12], 0xc0, 12), b[len(b)-4:]...) })},
		{"cut question", msg("a.example.org.", dns.TypeA, nil)[:dnsmsg.HeaderLen+5]},
	}
	// Fill the cache through the plugin's own path.
	for _, tc := range cases {
		exchangeRaw(t, udp, tc.pkt, 2*time.Second)
	}
	for _, tc := range cases {
		want := exchangeRaw(t, udp, tc.pkt, 2*time.Second)
		got := exchangeRaw(t, fe, tc.pkt, 2*time.Second)
		for try := 0; try < 5 && !bytes.Equal(got, want); try++ {
			// Entries age in whole seconds: where a second began between
			// the two, the server's next reply is the one to match, once
			// the plugin's clock, up to a tick late and later on a busy
			// machine, has seen that second too.
			time.Sleep(20 * time.Millisecond)
			want = exchangeRaw(t, udp, tc.pkt, 2*time.Second)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: front end replied\n%s\nserver replied\n%s", tc.name, dump(got), dump(want))
		}
	}
	// No reply to a response or to a runt, from either.
	for name, pkt := range map[string][]byte{
		"response": msg("a.example.org.", dns.TypeA, func(m *dns.Msg) { m.Response = true }),
		"runt":     {0x42},
	} {
		if r := exchangeRaw(t, fe, pkt, 300*time.Millisecond); r != nil {
			t.Errorf("%s: front end replied %x", name, r)
		}
	}
}

// dump prints a reply for a failure message.
func dump(b []byte) string {
	if b == nil {
		return "(nothing)"
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		return err.Error()
	}
	return m.String()
}

// TestFrontendServesStale: expired entries go through the chain, which
// serves them stale and refreshes them, as in the plugin's mode.
func TestFrontendServesStale(t *testing.T) {
	t.Parallel()
	u := newUpstream()
	u.add("s.example.org.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("s.example.org. 1 IN A 192.0.2.7")}, nil, nil)
	up := startUpstream(t, u)
	// MINTTL 0: the entry lives as long as its record's TTL of 1 second.
	fe, _, _ := startFrontend(t, func(fe string) string {
		return cacheCorefile(up, "success 10000 3600 0", "serve_stale 1h", "frontend "+fe)
	})
	req := test.Case{Qname: "s.example.org.", Qtype: dns.TypeA}.Msg()
	req.SetEdns0(1232, false)
	exchangeUDP(t, fe, req)
	time.Sleep(2100 * time.Millisecond)
	u.set("s.example.org.", dns.TypeA, func(r *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		return m.SetRcode(r, dns.RcodeServerFailure)
	})
	r, _ := exchangeUDP(t, fe, req)
	if len(r.Answer) != 1 || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("stale answer: %v", r)
	}
	var ede *dns.EDNS0_EDE
	for _, o := range r.IsEdns0().Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			ede = e
		}
	}
	if ede == nil || ede.InfoCode != edeStaleAnswer {
		t.Errorf("stale answer without EDE 3 (Stale Answer): %v", r.IsEdns0())
	}
}

// TestFrontendRefusesBypass: a block where hits would skip access control,
// TSIG checks, AAAA synthesis or a view's filter does not start.
func TestFrontendRefusesBypass(t *testing.T) {
	fe := freePort(t)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search example.org\nnameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, before, want string }{
		{"acl", "acl {\n\t\tblock net 192.0.2.0/24\n\t}", "bypass acl"},
		{"tsig", "tsig {\n\t\tsecret key. c2VjcmV0\n\t}", "bypass tsig"},
		{"dns64", "dns64", "bypass dns64"},
		{"view", "view v {\n\t\texpr true\n\t}", "filters (view)"},
		{"rewrite", "rewrite name a.example.org b.example.org", "bypass rewrite"},
		{"autopath", "autopath . " + resolv, "bypass autopath"},
		{"dnstap", "dnstap /tmp/compactcache-test-dnstap.sock", "bypass dnstap"},
		{"siit", "siit", "bypass siit"},
	}
	for _, tc := range cases {
		corefile := `.:0 {
	bind 127.0.0.1
	` + tc.before + `
	compactcache {
		frontend ` + fe + `
	}
	whoami
}`
		err := startError(corefile)
		if err == nil {
			t.Errorf("%s: started; want an error", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q, want it to say %q", tc.name, err, tc.want)
		}
	}
}

// TestFrontendShedsLoad: with one request allowed in the chain and the
// upstream stuck, further misses are answered SERVFAIL and counted, not
// queued; with EDNS, their reply has OPT.
func TestFrontendShedsLoad(t *testing.T) {
	const zone = "shed.frontend.test."
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	u := newUpstream()
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		u.set(n+"."+zone, dns.TypeA, func(r *dns.Msg) *dns.Msg {
			<-release
			m := new(dns.Msg)
			return m.SetReply(r)
		})
	}
	up := startUpstream(t, u)
	fe, _, _ := startFrontend(t, func(fe string) string {
		return zone + `:0 {
	bind 127.0.0.1
	compactcache {
		frontend ` + fe + ` {
			inflight 1
		}
	}
	forward . ` + up + ` {
		max_concurrent 10
	}
}`
	})
	shed := frontendCount(zone, "shed")
	for i, n := range []string{"a", "b", "c", "d", "e"} {
		m := test.Case{Qname: n + "." + zone, Qtype: dns.TypeA}.Msg()
		edns := i >= 3
		if edns {
			m.SetEdns0(1232, i == 4)
		}
		b, _ := m.Pack()
		reply := exchangeRaw(t, fe, b, 500*time.Millisecond)
		if i == 0 {
			continue // in the chain, stuck with the upstream
		}
		// Shed, but answered: a client left waiting would wait its timeout.
		r := new(dns.Msg)
		if reply == nil || r.Unpack(reply) != nil || r.Rcode != dns.RcodeServerFailure || r.Id != m.Id || len(r.Question) != 1 || r.Question[0] != m.Question[0] {
			t.Errorf("request %d shed: reply %v, want SERVFAIL with its ID and question", i, r)
		}
		// RFC 6891 6.1.1: a reply to a request with EDNS has OPT, as
		// CoreDNS's own error replies have.
		if o := r.IsEdns0(); edns && (o == nil || o.UDPSize() != 1232 || o.Do() != (i == 4) || o.Version() != 0) {
			t.Errorf("request %d shed: OPT %v, want the request's UDP size and DO", i, o)
		}
	}
	if got := frontendCount(zone, "shed") - shed; got != 4 {
		t.Errorf("%v requests shed, want 4", got)
	}
	once.Do(func() { close(release) })
}

// TestFrontendCountsEachRequestOnce: each request the front end reads is
// counted under one result of coredns_compactcache_frontend_requests_total:
// runts, replies and requests that do not unpack were counted both handed
// to the chain and dropped, and took a slot of inflight.
func TestFrontendCountsEachRequestOnce(t *testing.T) {
	const zone = "count.frontend.test."
	up := startUpstream(t, newUpstream())
	fe, _, _ := startFrontend(t, func(fe string) string {
		return zone + `:0 {
	bind 127.0.0.1
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + `
}`
	})
	resp := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
	resp.Response = true
	rb, err := resp.Pack()
	if err != nil {
		t.Fatal(err)
	}
	cut := slices.Clone(rb[:len(rb)-3])
	cut[dnsmsg.OffFlags] &^= dnsmsg.QR >> 8 // a request whose question is cut
	results := []string{"hit", "chain", "shed", "dropped"}
	counts := func() map[string]float64 {
		m := map[string]float64{}
		for _, r := range results {
			m[r] = frontendCount(zone, r)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{
		{"runt", []byte{1, 2, 3, 4, 5}},
		{"reply", rb},
		{"cut", cut},
	} {
		for _, proto := range []string{"udp", "tcp"} {
			before := counts()
			if proto == "udp" {
				exchangeRaw(t, fe, tc.pkt, 300*time.Millisecond)
			} else {
				exchangeTCPRaw(t, fe, [][]byte{tc.pkt}, true, 300*time.Millisecond)
			}
			var total float64
			after := counts()
			for _, r := range results {
				total += after[r] - before[r]
			}
			if total != 1 || after["dropped"]-before["dropped"] != 1 {
				t.Errorf("%s over %s: counted %v times, want once, dropped: %v to %v", tc.name, proto, total, before, after)
			}
		}
	}
}

// TestFrontendLogsSampledHits: `log 2` logs every second hit of a socket.
func TestFrontendLogsSampledHits(t *testing.T) {
	logs := testenv.CaptureLog(t)
	up := startUpstream(t, exampleUpstream())
	fe, _, _ := startFrontend(t, func(fe string) string {
		return cacheCorefile(up, "frontend "+fe+" {\n\t\t\tsockets 1\n\t\t\tlog 2\n\t\t}")
	})
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	for range 5 { // a miss, then 4 hits
		exchangeUDP(t, fe, req)
	}
	// A hit is logged once its reply is sent: wait for the last one's line.
	var lines []string
	for deadline := time.Now().Add(2 * time.Second); len(lines) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		lines = lines[:0]
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "front end hit") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d front end hits logged, want 2:\n%s", len(lines), logs)
	}
	for _, l := range lines {
		if !strings.Contains(l, `"A IN a.example.org. udp `) || !strings.Contains(l, " NOERROR ") {
			t.Errorf("log line %q lacks the question or the rcode", l)
		}
	}
}

// startReloadable starts a block of zone whose cache has a front end, with
// options in its braces, before forward to up, and before the cache the
// plugins before says. It returns the front end's address, the instance,
// which the caller stops, and the block's Corefile with more plugins put
// before the cache, for the reloads the test makes.
func startReloadable(t *testing.T, zone, up, before, options string) (string, *caddy.Instance, func(extra string) string) {
	t.Helper()
	fe := ""
	corefile := func(extra string) string {
		return zone + ":0 {\n\tbind 127.0.0.1\n\t" + before + "\n\t" + extra + "\n\tcompactcache {\n\t\tfrontend " + fe +
			" {\n\t\t\t" + options + "\n\t\t}\n\t}\n\tforward . " + up + "\n}\n"
	}
	_, inst, _ := startOnFreePorts(t, 1, func(fes []string) string {
		fe = fes[0]
		return corefile("")
	}, nil)
	return fe, inst, corefile
}

// TestFrontendSurvivesReload: the front end of the reloaded instance opens
// its sockets beside the old ones and answers from the handed-over store;
// the old front end's sockets close with the old instance.
func TestFrontendSurvivesReload(t *testing.T) {
	const zone = "reload.frontend.test."
	u := upstreamOfA(zone)
	fe, inst, corefile := startReloadable(t, zone, startUpstream(t, u), "", "")
	var err error
	defer func() { stopInstance(inst) }()
	req := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, fe, req)
	for i := range 2 {
		serverMu.Lock()
		inst, err = inst.Restart(corefileInput(corefile(strings.Repeat("errors\n\t", i%2))))
		serverMu.Unlock()
		if err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		hits := frontendCount(zone, "hit")
		for range 3 {
			if r, _ := exchangeUDP(t, fe, req); len(r.Answer) != 1 {
				t.Fatalf("reload %d: reply %v", i, r)
			}
		}
		if got := frontendHits(zone, hits, 3); got != 3 {
			t.Errorf("reload %d: %v front end hits, want 3", i, got)
		}
	}
	if n := u.count("a."+zone, dns.TypeA); n != 1 {
		t.Errorf("upstream asked %d times, want 1: the store was handed over", n)
	}

	// A reload that fails after the new front end opened its sockets (the
	// second block starts after the first, and may not) leaves the old
	// instance serving, and no socket of the new one beside it to take
	// datagrams nobody reads.
	serverMu.Lock()
	failed, err := inst.Restart(corefileInput(corefile("") + "\n.:0 {\n\tbind 127.0.0.1\n\tcache\n\tcompactcache\n\twhoami\n}"))
	serverMu.Unlock()
	if err == nil {
		inst = failed
		t.Fatal("a reload with cache beside compactcache succeeded")
	}
	pkt, err := req.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if lost := lostRequests(t, fe, pkt); lost > 0 {
		t.Errorf("after a failed reload, %d of %d requests to the front end got no reply", lost, lossProbes)
	}

	// The same from an instance without compactcache, which has no hook to
	// close the failed instance's front ends: the next that starts does.
	serverMu.Lock()
	inst, err = inst.Restart(corefileInput(".:0 {\n\tbind 127.0.0.1\n\twhoami\n}"))
	if err == nil {
		failed, err = inst.Restart(corefileInput(corefile("") + "\n.:0 {\n\tbind 127.0.0.1\n\tcache\n\tcompactcache\n\twhoami\n}"))
		if err == nil {
			inst = failed
		}
	}
	serverMu.Unlock()
	if err == nil {
		t.Fatal("a reload with cache beside compactcache succeeded")
	}
	serverMu.Lock()
	inst, err = inst.Restart(corefileInput(corefile("")))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if lost := lostRequests(t, fe, pkt); lost > 0 {
		t.Errorf("after a failed reload from a block without compactcache, %d of %d requests to the front end got no reply", lost, lossProbes)
	}
}

// TestFrontendTCPAfterReload: a TCP connection to the front end opened
// before a reload is served after it by the new instance: its misses go to
// the new chain and upstream. It was served by the old instance's chain and
// upstream for as long as the client kept it, and then closed at the
// reload, as CoreDNS's own server closes its connections, losing the
// requests sent on it that the old instance had not read.
func TestFrontendTCPAfterReload(t *testing.T) {
	const zone = "tcpreload.frontend.test."
	u1, u2 := newUpstream(), newUpstream()
	for i := range 5 {
		n := fmt.Sprintf("x%d.%s", i, zone)
		u1.add(n, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(n + " 300 IN A 192.0.2.1")}, nil, nil)
		u2.add(n, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(n + " 300 IN A 192.0.2.2")}, nil, nil)
	}
	up1, up2, fe := startUpstream(t, u1), startUpstream(t, u2), ""
	corefile := func(up string) string {
		return zone + `:0 {
	bind 127.0.0.1
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + `
}`
	}
	_, inst, _ := startOnFreePorts(t, 1, func(fes []string) string {
		fe = fes[0]
		return corefile(up1)
	}, nil)
	defer func() { stopInstance(inst) }()
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	conn, err := c.Dial(fe)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(i int) (*dns.Msg, error) {
		m := test.Case{Qname: fmt.Sprintf("x%d.%s", i, zone), Qtype: dns.TypeA}.Msg()
		r, _, err := c.ExchangeWithConn(m, conn)
		return r, err
	}
	if r, err := ask(0); err != nil || len(r.Answer) != 1 {
		t.Fatalf("before the reload: %v %v", r, err)
	}
	serverMu.Lock()
	inst, err = inst.Restart(corefileInput(corefile(up2)))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 5; i++ {
		r, err := ask(i)
		if err != nil {
			t.Fatalf("query %d on a TCP connection opened before the reload: %v", i, err)
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.2" {
			t.Fatalf("query %d on a TCP connection opened before the reload: answer %v, want the new instance's upstream's", i, r.Answer)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestFrontendTCPHitAfterReloadWithLog: a hit on a TCP connection opened
// before a reload, in a block with log before the cache. The old front end
// closed its access log at the reload while the connection's reader still
// answered hits, whose lines were sent on the closed queue: the process
// panicked ("send on closed channel"), which takes this test binary down.
func TestFrontendTCPHitAfterReloadWithLog(t *testing.T) {
	const zone = "logreload.frontend.test."
	u := upstreamOfA(zone)
	fe, inst, corefile := startReloadable(t, zone, startUpstream(t, u), "log", "")
	defer func() { stopInstance(inst) }()
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	conn, err := c.Dial(fe)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
	for range 2 { // the miss, then a hit
		if _, _, err := c.ExchangeWithConn(m, conn); err != nil {
			t.Fatal(err)
		}
	}
	serverMu.Lock()
	inst, err = inst.Restart(corefileInput(corefile("errors")))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	c.ExchangeWithConn(m, conn) // a hit on the old connection, if it is still open
	time.Sleep(100 * time.Millisecond)
}

// TestFrontendUDPAcrossReload: a miss in the chain when a reload comes is
// still answered, as CoreDNS's own server waits (up to its grace time) for
// the requests in flight before it closes its socket: the front end closed
// its sockets at once, and the chain's reply was never sent. And no request
// that comes meanwhile is lost, as none is by CoreDNS's own server, which
// hands its socket to the new instance: the old front end's sockets stayed
// in their address's SO_REUSEPORT group, unread, until that reply was sent.
func TestFrontendUDPAcrossReload(t *testing.T) {
	for _, wait := range []string{"thread", "poller"} {
		t.Run(wait, func(t *testing.T) {
			zone := wait + ".udpreload.frontend.test."
			u := newUpstream()
			u.add("b."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("b." + zone + " 300 IN A 192.0.2.2")}, nil, nil)
			asked, release := u.hold("a." + zone + " 300 IN A 192.0.2.1")
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			fe, inst, corefile := startReloadable(t, zone, startUpstream(t, u), "", "wait "+wait)
			defer func() { stopInstance(inst) }()
			pkt, err := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg().Pack()
			if err != nil {
				t.Fatal(err)
			}
			hit, err := test.Case{Qname: "b." + zone, Qtype: dns.TypeA}.Msg().Pack()
			if err != nil {
				t.Fatal(err)
			}
			if exchangeRaw(t, fe, hit, time.Second) == nil {
				t.Fatal("no reply to the miss of b")
			}
			got := make(chan []byte, 1)
			go func() { got <- exchangeRaw(t, fe, pkt, 15*time.Second) }()
			<-asked
			serverMu.Lock()
			inst, err = inst.Restart(corefileInput(corefile("errors")))
			serverMu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			// Each from a socket of its own, which the kernel hashes to
			// any of the address's sockets.
			lost := 0
			for range 32 {
				if exchangeRaw(t, fe, hit, 250*time.Millisecond) == nil {
					lost++
				}
			}
			if lost > 0 {
				t.Errorf("%d of 32 requests sent after the reload, while a miss was in flight, got no reply", lost)
			}
			once.Do(func() { close(release) })
			if r := <-got; r == nil {
				t.Errorf("a miss in flight during a reload got no reply")
			}
		})
	}
}

// TestFrontendUDPAcrossReloads: requests sent without a pause through
// reloads are all answered, hits and misses, as by CoreDNS's own server,
// which hands its socket to the new instance. The datagrams that reached an
// old front end's sockets after its readers' last read were lost with the
// sockets' close.
func TestFrontendUDPAcrossReloads(t *testing.T) {
	for _, wait := range []string{"thread", "poller"} {
		t.Run(wait, func(t *testing.T) {
			zone := wait + ".udpreloads.frontend.test."
			u := upstreamOfA(zone)
			fe, inst, corefile := startReloadable(t, zone, startUpstream(t, u), "", "sockets 2\n\t\t\twait "+wait)
			defer func() { stopInstance(inst) }()
			hit, err := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg().Pack()
			if err != nil {
				t.Fatal(err)
			}
			if exchangeRaw(t, fe, hit, time.Second) == nil {
				t.Fatal("no reply to the miss of a")
			}
			// Each client's socket is hashed to one of the address's
			// sockets; a miss of a name of its own every few requests.
			const clients = 8
			var wg sync.WaitGroup
			var sent, lost [clients]int
			stop := make(chan struct{})
			for c := range clients {
				wg.Go(func() {
					conn, err := net.Dial("udp", fe)
					if err != nil {
						t.Error(err)
						return
					}
					defer conn.Close()
					buf := make([]byte, dns.MaxMsgSize)
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						pkt := slices.Clone(hit)
						if i%8 == 7 {
							pkt, _ = test.Case{Qname: fmt.Sprintf("m%d-%d.%s", c, i, zone), Qtype: dns.TypeA}.Msg().Pack()
						}
						binary.BigEndian.PutUint16(pkt, uint16(i))
						sent[c]++
						conn.SetDeadline(time.Now().Add(2 * time.Second))
						if _, err := conn.Write(pkt); err != nil {
							t.Error(err)
							return
						}
						for {
							n, err := conn.Read(buf)
							if err != nil {
								lost[c]++
								break
							}
							if n >= 2 && binary.BigEndian.Uint16(buf) == uint16(i) {
								break
							}
						}
					}
				})
			}
			for i := range 5 {
				time.Sleep(50 * time.Millisecond)
				serverMu.Lock()
				inst, err = inst.Restart(corefileInput(corefile(strings.Repeat("errors\n\t", i%2))))
				serverMu.Unlock()
				if err != nil {
					t.Error(err)
					break
				}
			}
			time.Sleep(50 * time.Millisecond)
			close(stop)
			wg.Wait()
			var all, gone int
			for c := range clients {
				all, gone = all+sent[c], gone+lost[c]
			}
			if gone > 0 {
				t.Errorf("%d of %d requests sent through 5 reloads got no reply", gone, all)
			}
		})
	}
}

// TestFrontendTCPTimeouts: the block's timeouts plugin sets the read and
// idle timeouts and the queries per connection of the server's own TCP
// listener, and the front end's follows them: it closed connections idle
// for 10 s whatever the block said, served any number of queries on one,
// and gave a new connection 10 s, not the server's 3, for its first query.
func TestFrontendTCPTimeouts(t *testing.T) {
	const zone = "timeouts.frontend.test."
	u := upstreamOfA(zone)
	up := startUpstream(t, u)
	fe, _, tcp := startFrontend(t, func(fe string) string {
		return zone + `:0 {
	bind 127.0.0.1
	timeouts {
		read 1s
		idle 1s
		maxtcpqueries 2
	}
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + `
}`
	})
	pkt, err := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg().Pack()
	if err != nil {
		t.Fatal(err)
	}
	exchangeTCPRaw(t, tcp, [][]byte{pkt}, true, time.Second) // the miss
	for _, addr := range []struct{ name, addr string }{{"server", tcp}, {"front end", fe}} {
		// Three pipelined queries get two replies, then the connection
		// closes.
		if got := exchangeTCPRaw(t, addr.addr, [][]byte{pkt, pkt, pkt}, false, 3*time.Second); len(got) != 2 {
			t.Errorf("%s: maxtcpqueries 2: %d replies to 3 pipelined queries on one connection, want 2", addr.name, len(got))
		}
		// A connection that sends nothing is closed after the read timeout,
		// and one idle after a query after the idle timeout.
		for _, queries := range [][]byte{nil, pkt} {
			conn, err := net.Dial("tcp", addr.addr)
			if err != nil {
				t.Fatal(err)
			}
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			if queries != nil {
				if _, err := conn.Write(binary.BigEndian.AppendUint16(nil, uint16(len(pkt)))); err == nil {
					conn.Write(pkt)
				}
			}
			_, err = io.ReadAll(conn)
			if took := time.Since(start); err != nil || took > 2*time.Second {
				t.Errorf("%s: a connection %d queries in still open after %v (%v), want closed after 1s", addr.name, len(queries)/len(pkt), took.Round(time.Millisecond), err)
			}
			conn.Close()
		}
	}
}

// exchangeTCPRaw writes msgs, each with its length, on one connection,
// half-closing it if asked, and reads the replies until the connection
// closes or wait passes.
func exchangeTCPRaw(t *testing.T, addr string, msgs [][]byte, halfClose bool, wait time.Duration) [][]byte {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wait))
	var out []byte
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	if _, err := conn.Write(out); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		conn.(*net.TCPConn).CloseWrite()
	}
	var replies [][]byte
	for {
		var l [2]byte
		if _, err := io.ReadFull(conn, l[:]); err != nil {
			return replies
		}
		b := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(conn, b); err != nil {
			return replies
		}
		replies = append(replies, b)
	}
}

// lossProbes is how many requests lostRequests sends: with half the
// datagrams going to a socket nobody reads, all are answered 2^-16 of the
// time.
const lossProbes = 16

// lostRequests sends pkt to addr lossProbes times and returns how many got
// no reply within a second.
func lostRequests(t *testing.T, addr string, pkt []byte) int {
	t.Helper()
	lost := 0
	for range lossProbes {
		if exchangeRaw(t, addr, pkt, time.Second) == nil {
			lost++
		}
	}
	return lost
}

// FuzzFrontendRequest: whatever the packet, the front end's parse does not
// panic, and a packet it takes is one miekg/dns reads, into the very query
// and key the plugin's own load makes of the message.
func FuzzFrontendRequest(f *testing.F) {
	for _, b := range fzRequestSeeds() {
		f.Add(b)
	}
	client := netip.MustParseAddr(clientAddr.IP.String())
	f.Fuzz(func(t *testing.T, pkt []byte) {
		for _, add := range []bool{false, true} {
			cfg := ecsConfig{config.Defaults().ECS}
			cfg.Add = add
			fe := scratchPool.New().(*scratch)
			if !fe.readPacket(pkt, client, false, &cfg) {
				return
			}
			m := new(dns.Msg)
			if err := m.Unpack(pkt); err != nil {
				t.Fatalf("the front end takes a request miekg/dns rejects: %v", err)
			}
			pl := scratchPool.New().(*scratch)
			if m.Opcode != dns.OpcodeQuery || len(m.Question) != 1 || !pl.readMsg(m, &discard{}, &cfg) {
				t.Fatalf("the front end takes a request the plugin does not:\n%s", m)
			}
			a, b := fe.q, pl.q
			if !bytes.Equal(a.name, b.name) || len(a.opts)+len(b.opts) != 0 || !bytes.Equal(fe.key, pl.key) {
				t.Fatalf("name %x, key %x, options %x; the plugin's: %x, %x, %x", a.name, fe.key, a.opts, b.name, pl.key, b.opts)
			}
			a.name, a.opts, a.nsid, b.name, b.opts = nil, nil, false, nil, nil // nsid: the front end's alone
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("query %+v; the plugin's %+v", a, b)
			}
		}
	})
}

// TestFrontendSocketLoopAllocatesNothing runs hits through the real sockets,
// system calls included, and counts the whole process's allocations: the
// client side uses one connected socket and fixed buffers. The same loop
// against the server's own listener shows that the count sees allocations.
func TestFrontendSocketLoopAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector; .ci/run runs this test without it")
	}
	up := startUpstream(t, exampleUpstream())
	for _, tc := range []struct{ name, before string }{
		{"alone", ""},
		// The kube-dns Corefile's plugins that act on hits: the series of
		// each hit counted, its records rotated.
		{"with prometheus and loadbalance", "prometheus 127.0.0.1:0\n\tloadbalance"},
	} {
		t.Run(tc.name, func(t *testing.T) { testFrontendSocketLoopAllocatesNothing(t, up, tc.before) })
	}
}

func testFrontendSocketLoopAllocatesNothing(t *testing.T, up, before string) {
	fe, udp, _ := startFrontend(t, func(fe string) string {
		return strings.Replace(cacheCorefile(up, "frontend "+fe), "\tcompactcache", "\t"+before+"\n\tcompactcache", 1)
	})
	req := test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, fe, req) // the miss
	pkt, _ := req.Pack()
	buf := make([]byte, dns.MaxMsgSize)
	// perHit returns the process's allocations per hit asked of addr.
	perHit := func(addr string) float64 {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ask := func(n int) {
			for range n {
				conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := conn.Write(pkt); err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Read(buf); err != nil {
					t.Fatal(err)
				}
			}
		}
		ask(100) // pools and buffers grow to their steady size
		const n = 2000
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ask(n)
		runtime.ReadMemStats(&after)
		return float64(after.Mallocs-before.Mallocs) / n
	}
	server, front := perHit(udp), perHit(fe)
	// The count is the process's: what other goroutines allocate meanwhile
	// (earlier tests' servers winding down, a busy machine's slower hits)
	// only adds to it. The least of three runs is the front end's.
	for range 2 {
		front = min(front, perHit(fe))
	}
	t.Logf("allocations per hit in the whole process: %.3f through the server, %.3f through the front end (least of three runs)", server, front)
	if server < 1 {
		t.Fatalf("%.3f allocations per hit through the server: the count does not see them", server)
	}
	// Timers of the deadlines and the runtime's own bookkeeping may
	// allocate now and then; a hit path that allocated would show 1 or more.
	if front > 0.1 {
		t.Errorf("%.3f allocations per hit through the front end, want 0", front)
	}
}

// TestPacketAnswerAsPlugin: the cache's half of a front-end hit (the front
// end's own half is internal/frontend's TestFrontendHitAllocatesNothing)
// answers a request packet with the plugin's reply, counts it, and
// allocates nothing.
func TestPacketAnswerAsPlugin(t *testing.T) {
	c := newTestCache(t, exampleUpstream(), newClock())
	req := test.Case{Qname: "www.example.org.", Qtype: dns.TypeA}.Msg()
	req.SetEdns0(1232, true)
	ask(t, c, req, false) // the miss fills the cache
	want := ask(t, c, req, false)
	pkt, err := req.Pack()
	if err != nil {
		t.Fatal(err)
	}
	a := frontCache{c}.Answerer("test")
	now := c.now()
	var hit frontend.Hit
	reply := a.Answer(pkt, netip.MustParseAddr("127.0.0.1"), false, now, &hit)
	got := new(dns.Msg)
	if err := got.Unpack(reply); err != nil {
		t.Fatalf("the front end's reply does not unpack: %v", err)
	}
	if got.String() != want.String() {
		t.Errorf("front end reply\n%s\nplugin reply\n%s", got, want)
	}
	if !hit.DO || hit.UDPSize != 1232 {
		t.Errorf("hit %+v, want DO and the request's size 1232", hit)
	}
	if !raceEnabled {
		if allocs := testing.AllocsPerRun(1000, func() { a.Answer(pkt, netip.Addr{}, false, now, &hit) }); allocs != 0 {
			t.Errorf("%v allocations per answer, want 0", allocs)
		}
	}
	pkt[len(pkt)-1] ^= 0xFF // no longer a request the front end reads alone
	if a.Answer(pkt[:5], netip.Addr{}, false, now, &hit) != nil {
		t.Error("a cut request was answered")
	}
}

// TestFrontendHonoursBufsize: bufsize clamps the client's EDNS buffer before
// the cache, so a hit from the front end must fit the clamped size too, as
// the server's own reply does, byte for byte.
func TestFrontendHonoursBufsize(t *testing.T) {
	u := newUpstream()
	var big []dns.RR
	for i := range 40 {
		big = append(big, test.TXT(fmt.Sprintf(`big.example.org. 300 IN TXT "record %02d of a set too large for 512 bytes"`, i)))
	}
	u.add("big.example.org.", dns.TypeTXT, dns.RcodeSuccess, big, nil, nil)
	up := startUpstream(t, u)
	fe, udp, _ := startFrontend(t, func(fe string) string {
		return `.:0 {
	bind 127.0.0.1
	bufsize 512
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + `
}`
	})
	req := new(dns.Msg).SetQuestion("big.example.org.", dns.TypeTXT)
	req.SetEdns0(4096, false)
	exchangeUDP(t, udp, req) // the miss
	hits := frontendCount(".", "hit")
	want, _ := exchangeUDP(t, udp, req)
	got, n := exchangeUDP(t, fe, req)
	if frontendHits(".", hits, 1) != 1 {
		t.Fatal("the front end did not answer the hit itself")
	}
	if n > 512 || !got.Truncated {
		t.Errorf("front end hit of %d bytes, truncated %v: over bufsize's 512", n, got.Truncated)
	}
	if got.String() != want.String() {
		t.Errorf("front end hit\n%s\nserver's reply\n%s", got, want)
	}
}

// TestFrontendSharedByBlocks: blocks of one address with the same front
// end, as NodeLocal DNSCache has them, share it: each request goes to the
// cache of its zone's block, the longest zone that holds it, and each
// block's hits are its own. Blocks that would share it with other options,
// or on other servers, are refused.
func TestFrontendSharedByBlocks(t *testing.T) {
	u := newUpstream()
	for _, n := range []string{"www.inner.shared.test.", "www.shared.test.", "www.elsewhere.test."} {
		u.add(n, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(n + " 300 IN A 192.0.2.1")}, nil, nil)
	}
	up := startUpstream(t, u)
	var fe string
	block := func(zone, options string) string {
		return zone + `:0 {
	bind 127.0.0.1
	compactcache {
		frontend ` + fe + options + `
	}
	forward . ` + up + `
}
`
	}
	startFrontend(t, func(port string) string {
		fe = port
		return block("inner.shared.test.", "") + block("shared.test.", "") + block(".", "")
	})
	for _, c := range []struct{ name, zone string }{
		{"www.inner.shared.test.", "inner.shared.test."},
		{"www.shared.test.", "shared.test."},
		{"www.elsewhere.test.", "."},
	} {
		hits := frontendCount(c.zone, "hit")
		req := test.Case{Qname: c.name, Qtype: dns.TypeA}.Msg()
		for range 3 {
			if r, _ := exchangeUDP(t, fe, req); len(r.Answer) != 1 {
				t.Fatalf("%s: answer %v", c.name, r.Answer)
			}
		}
		if got := frontendHits(c.zone, hits, 2); got != 2 {
			t.Errorf("%s: %v hits of the block of %s, want 2", c.name, got, c.zone)
		}
		if n := u.count(c.name, dns.TypeA); n != 1 {
			t.Errorf("%s: upstream asked %d times, want 1", c.name, n)
		}
	}
	_, port, _ := net.SplitHostPort(freePort(t))
	for _, tc := range []struct{ corefile, want string }{
		{block("a.test.", "") + block("b.test.", " {\n\t\t\tsockets 1\n\t\t}"), "different options"},
		{block("a.test.", "") + strings.Replace(block("b.test.", ""), "b.test.:0", "b.test.:"+port, 1), "cannot share it"},
	} {
		if err := startError(tc.corefile); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("blocks sharing a front end, want an error saying %q: %v", tc.want, err)
		}
	}
}
