package frontend

import (
	"net/netip"
	"testing"

	corelog "github.com/coredns/coredns/plugin/log"
	"github.com/coredns/coredns/plugin/pkg/response"
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
