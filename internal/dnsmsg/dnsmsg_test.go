package dnsmsg

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func wire(t *testing.T, s string) []byte {
	t.Helper()
	var buf [MaxNameLen]byte
	n, err := PackName(dns.Fqdn(s), buf[:])
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf[:n]...)
}

// TestPackNameRefusesEscapeOver255: miekg/dns packs a\256 as a\000; the
// escapes up to \255, and an escaped backslash before digits, pack.
func TestPackNameRefusesEscapeOver255(t *testing.T) {
	var buf [MaxNameLen]byte
	for _, s := range []string{`a\256.`, `a\999.example.`, `\300.example.`, `a\\\256.`} {
		if n, err := PackName(s, buf[:]); err == nil || !strings.Contains(err.Error(), "above \\255") {
			t.Errorf("PackName(%q) = %q, %v; want an error saying the escape is above \\255", s, buf[:n], err)
		}
	}
	for _, s := range []string{`a\255.`, `a\\256.`, `a\0256.`, `a\25.`} {
		if _, err := PackName(s, buf[:]); err != nil {
			t.Errorf("PackName(%q): %v", s, err)
		}
	}
}

func TestZones(t *testing.T) {
	zs := NewZoneSet([]string{"example.org.", "Cluster.Local."})
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"example.org", true}, {"www.example.org", true}, {"xexample.org", false},
		{"a.svc.cluster.local", true}, {"org", false}, {"local", false},
	} {
		if got := zs.Matches(wire(t, tc.name)); got != tc.want {
			t.Errorf("Matches(%s) = %v, want %v", tc.name, got, tc.want)
		}
		if got := InZone(wire(t, tc.name), wire(t, "example.org")); got != (tc.want && tc.name != "a.svc.cluster.local") {
			t.Errorf("InZone(%s, example.org) = %v", tc.name, got)
		}
	}
	if !NewZoneSet([]string{"."}).Matches(wire(t, "any.name")) {
		t.Error("the root does not hold every name")
	}
	for _, tc := range []struct {
		of   []string
		want bool
	}{
		{nil, true}, {[]string{"www.example.org", "cluster.local"}, true},
		{[]string{"example.org", "org"}, false}, {[]string{"."}, false},
	} {
		if got := zs.Covers(NewZoneSet(tc.of)); got != tc.want {
			t.Errorf("Covers(%v) = %v, want %v", tc.of, got, tc.want)
		}
	}
}

func TestRdataNames(t *testing.T) {
	name := wire(t, "mail.example.org")
	soa := append(append(append([]byte{}, wire(t, "ns.example.org")...), wire(t, "h.example.org")...), make([]byte, 20)...)
	for _, tc := range []struct {
		what  string
		t     uint16
		rd    []byte
		n     int
		ok    bool
		first int // where the first name ends
	}{
		{"CNAME", dns.TypeCNAME, name, 1, true, len(name)},
		{"MX", dns.TypeMX, append([]byte{0, 10}, name...), 1, true, 2 + len(name)},
		{"MX without a name", dns.TypeMX, []byte{0, 10}, 0, false, 0},
		{"SOA", dns.TypeSOA, soa, 2, true, len(wire(t, "ns.example.org"))},
		{"SOA cut", dns.TypeSOA, soa[:len(soa)-1], 2, false, len(wire(t, "ns.example.org"))},
		{"SOA of 19 bytes", dns.TypeSOA, make([]byte, 19), 2, false, 1},
		{"CNAME with bytes after", dns.TypeCNAME, append(append([]byte{}, name...), 1), 1, false, len(name)},
		{"A", dns.TypeA, []byte{192, 0, 2, 1}, 0, true, 0},
	} {
		_, ends, n, ok := RdataNames(tc.t, tc.rd)
		if n != tc.n || ok != tc.ok || n > 0 && ends[0] != tc.first {
			t.Errorf("%s: ends %v n %d ok %v, want n %d ok %v first end %d", tc.what, ends, n, ok, tc.n, tc.ok, tc.first)
		}
		if Compressible(tc.t) != (tc.t != dns.TypeA) {
			t.Errorf("%s: Compressible %v", tc.what, Compressible(tc.t))
		}
	}
}

func TestCompressor(t *testing.T) {
	msg := make([]byte, HeaderLen)
	msg = append(msg, wire(t, "www.example.org")...)
	var c Compressor
	c.Reset()
	msg = c.AppendName(msg, wire(t, "mail.example.org"))
	// mail + a pointer to example.org in the question.
	if got := msg[HeaderLen+len(wire(t, "www.example.org")):]; len(got) != 7 || got[5] != 0xC0 || got[6] != HeaderLen+4 {
		t.Fatalf("mail.example.org written as %x", got)
	}
	before := len(msg)
	msg = c.AppendName(msg, wire(t, "mail.example.org"))
	if got := msg[before:]; len(got) != 2 || got[0]&0xC0 != 0xC0 {
		t.Errorf("a name written before as %x: want a pointer", got)
	}
	// In another case, a pointer would change the name's case.
	before = len(msg)
	msg = c.AppendName(msg, wire(t, "MAIL.example.ORG"))
	if got := msg[before:]; len(got) != len(wire(t, "MAIL.example.ORG")) {
		t.Errorf("a name written before in other case as %x: want it whole", got)
	}
}

// BenchmarkPutPlainName writes names of the reference workload's shape and
// of a cluster's Services.
func BenchmarkPutPlainName(b *testing.B) {
	names := []string{"zymtqfsjxevynaju.gesyv.net.", "vwxdxx.npvhydjvcq.com.", "kube-dns.kube-system.svc.cluster.local.", "web-7f9c.default.svc.cluster.local."}
	var buf [MaxNameLen]byte
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := PutPlainName(buf[:], names[i%len(names)]); !ok {
			b.Fatal("not written")
		}
	}
}
