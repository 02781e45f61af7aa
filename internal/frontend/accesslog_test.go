package frontend

import (
	"bytes"
	"context"
	golog "log"
	"net/netip"
	"strings"
	"testing"

	corelog "github.com/coredns/coredns/plugin/log"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/pkg/replacer"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// TestAccessLogHitAfterClose: a reader the front end gave up waiting for
// may answer one more hit after the access log closed; its line is not
// written, and queuing it must not panic.
func TestAccessLogHitAfterClose(t *testing.T) {
	l := &corelog.Logger{Rules: []corelog.Rule{{NameScope: ".", Format: corelog.CommonLogFormat, Class: map[response.Class]struct{}{response.All: {}}}}}
	a := newAccessLog(l, prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"}))
	req := new(dns.Msg).SetQuestion("example.org.", dns.TypeA)
	pkt, err := req.Pack()
	if err != nil {
		t.Fatal(err)
	}
	reply, err := new(dns.Msg).SetReply(req).Pack()
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort("127.0.0.1:53")
	a.hit(pkt, reply, addr, addr, false, &Hit{}, 0)
	a.close()
	a.hit(pkt, reply, addr, addr, false, &Hit{}, 0)
}

// TestSampledLogIsCommonFormat: the line `log N` writes for a hit is the
// log plugin's common format, but for the duration: the client as the
// plugin writes it (an IPv4 client of a dual-stack socket unmapped), the
// request's buffer size as the plugin reads it (512 at least, 65535 over
// TCP), and the reply's flags. The line had no flags, so that the reply's
// size stood where they go, and gave the others as the socket read them.
func TestSampledLogIsCommonFormat(t *testing.T) {
	var logs bytes.Buffer
	prev := golog.Writer()
	golog.SetOutput(&logs)
	defer golog.SetOutput(prev)
	fe := &frontend{cfg: &Config{logEvery: 1}}
	for _, tc := range []struct {
		name   string
		client string
		tcp    bool
		edns   bool
	}{
		{"mapped IPv4 over UDP, no EDNS", "[::ffff:192.0.2.1]:5353", false, false},
		{"IPv6 over TCP, EDNS", "[2001:db8::1]:5353", true, true},
	} {
		req := new(dns.Msg).SetQuestion("example.org.", dns.TypeA)
		req.Id = 4242
		hit := &Hit{}
		if tc.edns {
			req.SetEdns0(1232, true)
			hit.DO, hit.UDPSize = true, 1232
		}
		pkt, err := req.Pack()
		if err != nil {
			t.Fatal(err)
		}
		m := new(dns.Msg).SetReply(req)
		m.RecursionAvailable = true
		reply, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		client := netip.MustParseAddrPort(tc.client)
		logs.Reset()
		fe.logHit(new(int), hit, len(pkt), reply, client, tc.tcp)

		// What the log plugin writes for the same request and reply.
		w := &recordWriter{&accessRecord{local: netip.MustParseAddrPort("[::]:53"), remote: client, tcp: tc.tcp}}
		rec := &dnstest.Recorder{Msg: m, Rcode: m.Rcode, Len: len(reply)}
		format := strings.TrimSuffix(corelog.CommonLogFormat, " {duration}")
		want := replacer.New().Replace(context.Background(), request.Request{W: w, Req: req}, rec, format)
		if !strings.Contains(logs.String(), want+" (front end hit") {
			t.Errorf("%s: logged\n%s\nwant the log plugin's\n%s", tc.name, logs.String(), want)
		}
	}
}
