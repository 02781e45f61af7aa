// The race detector's instrumentation makes every frame larger: the limit
// holds for the builds that serve.

//go:build !race

package compactcache

import (
	"os"
	"os/exec"
	"runtime/debug"
	"testing"

	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// The server runs each UDP query in a goroutine of its own, whose stack
// unpacking the query grows to 4 KiB. A hit that needs more copies that
// stack to one of 8 KiB, 2.5 µs a query and a third of the server's CPU
// per hit (found in bench/e2e's profiles, after a change that returned a
// struct by value through four frames).
const hitStackLimit = 4 << 10

// TestHitFitsTheServersStack runs CoreDNS in a child process, fills the
// cache, then forbids any goroutine stack over hitStackLimit and sends the
// query again: a hit that needs more crashes the child.
func TestHitFitsTheServersStack(t *testing.T) {
	if os.Getenv("COMPACTCACHE_STACK_CHILD") == "1" {
		serveHitUnderStackLimit(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHitFitsTheServersStack$")
	// Goroutines start with the smallest stack rather than one sized on
	// what the last GC saw, as they do in a server that just started.
	cmd.Env = append(os.Environ(), "COMPACTCACHE_STACK_CHILD=1", "GODEBUG=adaptivestackstart=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		// The limit holds for every goroutine of the child: the trace says
		// which one outgrew it, the hit's or another's.
		t.Fatalf("a goroutine of the server, while it answered a hit, needed a stack over %d bytes: %v\n%s", hitStackLimit, err, out)
	}
}

func serveHitUnderStackLimit(t *testing.T) {
	u := exampleUpstream()
	udp, _ := startCoreDNS(t, cacheCorefile(startUpstream(t, u)))
	req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA, Do: true}.Msg()
	exchangeUDP(t, udp, req) // the miss, which forward serves with stacks of its own size
	asked := u.count("a.example.org.", dns.TypeA)

	defer debug.SetMaxStack(debug.SetMaxStack(hitStackLimit))
	m, _ := exchangeUDP(t, udp, req)
	if again := u.count("a.example.org.", dns.TypeA) - asked; m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 || again != 0 {
		t.Fatalf("not a hit: rcode %d, %d answers, the upstream asked %d more times", m.Rcode, len(m.Answer), again)
	}
}
