//go:build linux

package compactcache

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	_ "github.com/coredns/coredns/plugin/nsid" // for TestFrontendNSIDAsServer
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// The front end's answers to requests at the edges of the protocol, each
// compared with what CoreDNS's own server, of the same instance, answers.

// TestFrontendReadsUDPAsServer: a UDP request is read as far as CoreDNS's
// server reads it, its first 512 bytes (miekg/dns's UDPSize, which CoreDNS
// leaves at its default): a query padded past them gets FORMERR, and one
// followed by garbage past them, even past 4096 bytes, its answer. The front
// end read 4096: it answered the first and dropped the last.
func TestFrontendReadsUDPAsServer(t *testing.T) {
	up := startUpstream(t, exampleUpstream())
	fe, udp, _ := startFrontend(t, func(fe string) string { return cacheCorefile(up, "frontend "+fe) })
	q := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	plain, _ := q.Pack()
	q.SetEdns0(1232, false)
	q.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, 600)}}
	padded, _ := q.Pack()
	exchangeRaw(t, udp, plain, 2*time.Second) // the miss
	for name, pkt := range map[string][]byte{
		"padded past 512":   padded,
		"garbage past 512":  append(bytes.Clone(plain), make([]byte, 600)...),
		"garbage past 4096": append(bytes.Clone(plain), make([]byte, 5000)...),
	} {
		want := exchangeRaw(t, udp, pkt, 2*time.Second)
		got := exchangeRaw(t, fe, pkt, 2*time.Second)
		for try := 0; try < 5 && !bytes.Equal(got, want); try++ {
			time.Sleep(20 * time.Millisecond) // a second's turn between the two: see testFrontendRepliesAsServer
			want = exchangeRaw(t, udp, pkt, 2*time.Second)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: front end replied\n%s\nserver replied\n%s", name, dump(got), dump(want))
		}
	}
}

// TestFrontendNSIDAsServer: with nsid before the cache, a hit asked for
// NSID gets it, as the plugin's hit does through nsid's writer; the front
// end answered it without, the option taken for one that changes nothing.
func TestFrontendNSIDAsServer(t *testing.T) {
	up := startUpstream(t, exampleUpstream())
	fe, udp, tcp := startFrontend(t, func(fe string) string {
		return strings.Replace(cacheCorefile(up, "frontend "+fe), "\tcompactcache", "\tnsid frontend-test\n\tcompactcache", 1)
	})
	q := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
	q.SetEdns0(1232, false)
	q.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
	pkt, _ := q.Pack()
	exchangeRaw(t, udp, pkt, 2*time.Second) // the miss
	compare := func(proto string, ask func(addr string) []byte, server string) {
		want, got := ask(server), ask(fe)
		for try := 0; try < 5 && !bytes.Equal(got, want); try++ {
			time.Sleep(20 * time.Millisecond) // a second's turn between the two: see testFrontendRepliesAsServer
			want = ask(server)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: front end replied\n%s\nserver replied\n%s", proto, dump(got), dump(want))
		}
	}
	compare("UDP", func(addr string) []byte { return exchangeRaw(t, addr, pkt, 2*time.Second) }, udp)
	compare("TCP", func(addr string) []byte {
		r := exchangeTCPRaw(t, addr, [][]byte{pkt}, true, 2*time.Second)
		if len(r) != 1 {
			return nil
		}
		return r[0]
	}, tcp)
}

// TestFrontendLeavesOtherBlocksNames: a name the server gives to another
// of its blocks, one without the front end, is that block's, however the
// front end's block came to hold it: here a reload added the block, and the
// store, handed over, kept the name's entry. The front end answered it from
// its block's cache, where the server asks the other block.
func TestFrontendLeavesOtherBlocksNames(t *testing.T) {
	const name = "a.other.frontend.test."
	u := newUpstream()
	u.add(name, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(name + " 300 IN A 192.0.2.1")}, nil, nil)
	fe, inst, corefile := startReloadable(t, ".", startUpstream(t, u), "", "")
	defer func() { stopInstance(inst) }()
	req := test.Case{Qname: name, Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, fe, req) // the miss: the entry
	reloadWithWhoami(t, &inst, corefile(""), "other.frontend.test.", fe, req)
}

// TestFrontendTCPAsServer: on one connection, pipelined requests, hits and
// misses among them, a request of no bytes, a runt and a response between
// them, and a last request cut short by the client's close, get the
// server's replies, in order.
func TestFrontendTCPAsServer(t *testing.T) {
	up := startUpstream(t, exampleUpstream())
	fe, udp, tcp := startFrontend(t, func(fe string) string { return cacheCorefile(up, "frontend "+fe) })
	msg := func(name string, qtype, id uint16, qr bool) []byte {
		m := test.Case{Qname: name, Qtype: qtype}.Msg()
		m.Id, m.Response = id, qr
		b, _ := m.Pack()
		return b
	}
	exchangeRaw(t, udp, msg("a.example.org.", dns.TypeA, 1, false), 2*time.Second) // a hit to come
	msgs := [][]byte{
		msg("a.example.org.", dns.TypeA, 1, false), msg("t.example.org.", dns.TypeTXT, 2, false), {},
		msg("a.example.org.", dns.TypeA, 3, true), {1, 2, 3}, msg("a.example.org.", dns.TypeA, 4, false),
		msg("a.example.org.", dns.TypeAAAA, 5, false)[:20],
	}
	exchangeTCPRaw(t, tcp, msgs, true, 2*time.Second) // the server's misses
	want := exchangeTCPRaw(t, tcp, msgs, true, 2*time.Second)
	got := exchangeTCPRaw(t, fe, msgs, true, 2*time.Second)
	for try := 0; try < 5 && fmt.Sprint(got) != fmt.Sprint(want); try++ {
		time.Sleep(20 * time.Millisecond) // a second's turn between the two: see testFrontendRepliesAsServer
		want = exchangeTCPRaw(t, tcp, msgs, true, 2*time.Second)
	}
	if len(want) != 4 {
		t.Errorf("the server gave %d replies, want 4: three answers and the cut request's FORMERR", len(want))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		for i := range max(len(got), len(want)) {
			var g, w []byte
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			t.Errorf("reply %d: front end\n%s\nserver\n%s", i, dump(g), dump(w))
		}
	}
}

// TestFrontendRoutesDSAsServer: the server gives a DS query to the block
// of the shortest of the zones that hold its name, the parent's side of a
// delegation, not the longest, as for other types. After a reload that
// added a block of a parent zone, the front end answered such a query from
// the cache of the child's block, which had held it before.
func TestFrontendRoutesDSAsServer(t *testing.T) {
	const name = "a.inner.ds.frontend.test."
	u := newUpstream()
	ds, err := dns.NewRR(name + " 300 IN DS 60485 5 1 2BB183AF5F22588179A53B0A98631FAD1A292118")
	if err != nil {
		t.Fatal(err)
	}
	u.add(name, dns.TypeDS, dns.RcodeSuccess, []dns.RR{ds}, nil, nil)
	fe, inst, corefile := startReloadable(t, "inner.ds.frontend.test.", startUpstream(t, u), "", "")
	defer func() { stopInstance(inst) }()
	req := test.Case{Qname: name, Qtype: dns.TypeDS}.Msg()
	exchangeUDP(t, fe, req) // the miss: the entry, in the block of inner.ds.frontend.test.
	reloadWithWhoami(t, &inst, corefile(""), "ds.frontend.test.", fe, req)
}

// reloadWithWhoami reloads *inst, which it sets to the new instance, with
// corefile and a block of whoami for zone, and checks that the front end
// fe answers req as that block does, the server's choice.
func reloadWithWhoami(t *testing.T, inst **caddy.Instance, corefile, zone, fe string, req *dns.Msg) {
	t.Helper()
	text := corefile + zone + ":0 {\n\tbind 127.0.0.1\n\twhoami\n}\n"
	serverMu.Lock()
	next, err := (*inst).Restart(corefileInput(text))
	serverMu.Unlock()
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	*inst = next
	udp, _ := serverAddrs(t, next, text)
	want, _ := exchangeUDP(t, udp, req)
	got, _ := exchangeUDP(t, fe, req)
	// whoami's reply: no answer, the client's address and port, which differ.
	if len(got.Answer) != len(want.Answer) || got.Rcode != want.Rcode || len(got.Extra) != len(want.Extra) {
		t.Errorf("front end replied\n%s\nserver replied\n%s", got, want)
	}
}
