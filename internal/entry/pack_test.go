package entry

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

// miekgRecord packs rr with dns.PackRR, uncompressed, and reads it back: the
// reference packRR must match byte for byte. It packs a copy, since PackRR
// sets the record's Rdlength.
func miekgRecord(rr dns.RR) (Record, error) {
	if rr != nil {
		rr = dns.Copy(rr)
	}
	buf := make([]byte, 2*dns.MaxMsgSize)
	off, err := dns.PackRR(rr, buf, 0, nil, false)
	if err != nil {
		return Record{}, err
	}
	// The owner's length is that of the name packed alone: an empty name
	// packs to nothing, which wireRecord cannot tell.
	n, err := dns.PackDomainName(rr.Header().Name, make([]byte, len(buf)), 0, nil, false)
	if err != nil {
		return Record{}, err
	}
	r := Record{Owner: buf[:n], Type: binary.BigEndian.Uint16(buf[n:]), Class: binary.BigEndian.Uint16(buf[n+2:]), TTL: binary.BigEndian.Uint32(buf[n+4:])}
	r.Rdata = buf[n+10 : off]
	if int(binary.BigEndian.Uint16(buf[n+8:])) != len(r.Rdata) {
		return Record{}, errors.New("PackRR's RDLENGTH is not its rdata's")
	}
	return r, nil
}

// samePacking reports how packRR's output for rr differs from dns.PackRR's,
// errors included, and checks that rr was not written to.
func samePacking(b *Builder, rr dns.RR) error {
	before := ""
	if rr != nil {
		rr.Header().Rdlength = 0xBEEF
		before = rr.String()
	}
	var got Record
	gotErr := b.packRR(rr, "", &got)
	want, wantErr := miekgRecord(rr)
	if rr != nil && rr.Header().Name == "" {
		// miekg/dns packs the empty owner as nothing; packRR refuses it.
		wantErr = errNoOwner
	}
	switch {
	case rr != nil && (rr.Header().Rdlength != 0xBEEF || rr.String() != before):
		return errors.New("packRR wrote to the record")
	case (gotErr == nil) != (wantErr == nil):
		return errors.New("packRR error " + errString(gotErr) + ", dns.PackRR error " + errString(wantErr))
	case gotErr != nil:
		return nil
	case !bytes.Equal(got.Owner, want.Owner):
		return errors.New("owner " + hex.EncodeToString(got.Owner) + ", want " + hex.EncodeToString(want.Owner))
	case got.Type != want.Type || got.Class != want.Class || got.TTL != want.TTL:
		return errors.New("type, class or TTL differ")
	case !bytes.Equal(got.Rdata, want.Rdata):
		return errors.New("rdata " + hex.EncodeToString(got.Rdata) + ", want " + hex.EncodeToString(want.Rdata))
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return "none"
	}
	return err.Error()
}

// maxRecordBytes is the plugin's default limit on an entry's records.
const maxRecordBytes = 64 << 10

// longName is a name of 255 bytes in wire form, the longest there is.
var longName = strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61) + "."

var mustRR = testenv.MustRR

// TestPackRRMatchesMiekg packs records of every type packRR handles, and of
// some it leaves to miekg/dns, and compares them byte for byte with
// dns.PackRR. own says that packRR packs the record itself: the test fails if
// it does not, so that the common types cannot silently take the slow path.
func TestPackRRMatchesMiekg(t *testing.T) {
	hdr := func(name string, t uint16) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: 300}
	}
	tests := []struct {
		name string
		rr   dns.RR
		own  bool
	}{
		{"A", &dns.A{Hdr: hdr("a.example.", dns.TypeA), A: net.IPv4(192, 0, 2, 1).To4()}, true},
		{"A of 16 bytes", &dns.A{Hdr: hdr("a.example.", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"A empty", &dns.A{Hdr: hdr("a.example.", dns.TypeA)}, true},
		{"A of 5 bytes", &dns.A{Hdr: hdr("a.example.", dns.TypeA), A: make(net.IP, 5)}, false},
		{"AAAA", &dns.AAAA{Hdr: hdr("a.example.", dns.TypeAAAA), AAAA: net.ParseIP("2001:db8::1")}, true},
		{"AAAA empty", &dns.AAAA{Hdr: hdr("a.example.", dns.TypeAAAA)}, true},
		{"AAAA of 4 bytes", &dns.AAAA{Hdr: hdr("a.example.", dns.TypeAAAA), AAAA: make(net.IP, 4)}, false},
		{"CNAME", &dns.CNAME{Hdr: hdr("a.example.", dns.TypeCNAME), Target: "B.Example."}, true},
		{"CNAME to the root", &dns.CNAME{Hdr: hdr("a.example.", dns.TypeCNAME), Target: "."}, true},
		{"CNAME empty target", &dns.CNAME{Hdr: hdr("a.example.", dns.TypeCNAME)}, false},
		{"NS", mustRR(t, "example. 300 IN NS ns1.example."), true},
		{"PTR", mustRR(t, "1.2.0.192.in-addr.arpa. 300 IN PTR host.example."), true},
		{"DNAME", mustRR(t, "example. 300 IN DNAME example.net."), true},
		{"MX", mustRR(t, "example. 300 IN MX 10 mail.example."), true},
		{"SRV", mustRR(t, "_sip._udp.example. 300 IN SRV 10 60 5060 sip.example."), true},
		{"SOA", mustRR(t, "example. 300 IN SOA ns.example. hostmaster.example. 2026 7200 3600 1209600 300"), true},
		{"TXT", mustRR(t, `a.example. 300 IN TXT "v=spf1 -all" "second"`), true},
		{"TXT of no strings", &dns.TXT{Hdr: hdr("a.example.", dns.TypeTXT)}, true},
		{"TXT of one empty string", &dns.TXT{Hdr: hdr("a.example.", dns.TypeTXT), Txt: []string{""}}, true},
		{"TXT of 255 bytes", &dns.TXT{Hdr: hdr("a.example.", dns.TypeTXT), Txt: []string{strings.Repeat("x", 255)}}, true},
		{"TXT of 256 bytes", &dns.TXT{Hdr: hdr("a.example.", dns.TypeTXT), Txt: []string{strings.Repeat("x", 256)}}, false},
		{"TXT with escapes", mustRR(t, `a.example. 300 IN TXT "a\"b\\c\065\255"`), false},
		{"TXT ending in a backslash", &dns.TXT{Hdr: hdr("a.example.", dns.TypeTXT), Txt: []string{`ab\`}}, false},
		{"DS", mustRR(t, "example. 300 IN DS 12345 13 2 2BB183AF5F22588179A53B0A98631FAD1A292118F0AB4C2D3A1A6B6B8B0AB27E"), true},
		{"DS odd hex", &dns.DS{Hdr: hdr("example.", dns.TypeDS), Digest: "abc"}, false},
		{"DS bad hex", &dns.DS{Hdr: hdr("example.", dns.TypeDS), Digest: "zz"}, false},
		{"DNSKEY", mustRR(t, "example. 300 IN DNSKEY 257 3 13 mdsswUyr3DPW132mOi8V9xESWE8jTo0dxCjjnopKl+GqJxpVXckHAeF+KkxLbxILfDLUT0rAK9iUzy1L53eKGQ=="), true},
		{"DNSKEY bad base64", &dns.DNSKEY{Hdr: hdr("example.", dns.TypeDNSKEY), PublicKey: "a!b="}, false},
		{"RRSIG", mustRR(t, "a.example. 300 IN RRSIG A 13 2 300 20270101000000 20260101000000 12345 example. oJB1W6WNGv+ldvQ3WDG0MQkg5IEhjRip8WTrPYGv07h108dUKGMeDPKijVCHX3DDKdfb+v6oB9wfuh3DTJXUAw=="), true},
		{"RRSIG with a signature over lines", &dns.RRSIG{Hdr: hdr("a.example.", dns.TypeRRSIG), SignerName: "example.", Signature: "AAEC\nAwQF"}, true},
		{"NSEC", mustRR(t, "a.example. 300 IN NSEC b.example. A NS SOA MX TXT AAAA RRSIG NSEC DNSKEY TYPE1234 TYPE65534"), true},
		{"NSEC without types", &dns.NSEC{Hdr: hdr("a.example.", dns.TypeNSEC), NextDomain: "b.example."}, true},
		{"NSEC out of order, accepted", &dns.NSEC{Hdr: hdr("a.example.", dns.TypeNSEC), NextDomain: "b.example.", TypeBitMap: []uint16{2, 1}}, false},
		{"NSEC out of order, refused", &dns.NSEC{Hdr: hdr("a.example.", dns.TypeNSEC), NextDomain: "b.example.", TypeBitMap: []uint16{15, 1}}, false},
		{"NSEC windows out of order", &dns.NSEC{Hdr: hdr("a.example.", dns.TypeNSEC), NextDomain: "b.example.", TypeBitMap: []uint16{256, 1}}, false},
		{"OPT", &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}}, true},
		{"OPT with ECS", &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}, Option: []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0)}}}, false},
		{"OPT with a bad ECS", &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}, Option: []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 7, SourceNetmask: 24}}}, false},
		{"NSEC3", mustRR(t, "0p9mhaveqvm6t7vbl5lop2u3t2rp3tom.example. 300 IN NSEC3 1 1 12 aabbccdd 2t7b4g4vsa5smi47k61mv5bv1a22bojr A RRSIG"), false},
		{"CAA", mustRR(t, `example. 300 IN CAA 0 issue "ca.example"`), false},
		{"HTTPS", mustRR(t, `example. 300 IN HTTPS 1 . alpn="h2,h3"`), false},
		{"unknown type", mustRR(t, `example. 300 IN TYPE65280 \# 2 abcd`), false},
		{"a type its header does not say", &dns.A{Hdr: hdr("a.example.", dns.TypeAAAA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner upper case kept", &dns.A{Hdr: hdr("WwW.ExAmPlE.", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner the root", &dns.NS{Hdr: hdr(".", dns.TypeNS), Ns: "a.root-servers.net."}, true},
		{"owner of 255 bytes", &dns.A{Hdr: hdr(longName, dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner longer than 255 bytes", &dns.A{Hdr: hdr("c."+longName, dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"target of 255 bytes", &dns.CNAME{Hdr: hdr("a.example.", dns.TypeCNAME), Target: longName}, true},
		{"owner with an escaped dot", &dns.A{Hdr: hdr(`a\.b.example.`, dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner with \\DDD", &dns.A{Hdr: hdr(`\065\000b.example.`, dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner with an escaped backslash", &dns.A{Hdr: hdr(`a\\b.example.`, dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"target with escapes", &dns.CNAME{Hdr: hdr("a.example.", dns.TypeCNAME), Target: `x\.y\032z.example.`}, false},
		{"signer with escapes", &dns.RRSIG{Hdr: hdr("a.example.", dns.TypeRRSIG), SignerName: `e\.x.`, Signature: "AAEC"}, false},
		{"owner with a label of 64", &dns.A{Hdr: hdr(strings.Repeat("a", 64)+".example.", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner not fully qualified", &dns.A{Hdr: hdr("a.example", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner with an empty label", &dns.A{Hdr: hdr("a..example.", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner with a leading dot", &dns.A{Hdr: hdr(".a.example.", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"owner empty", &dns.A{Hdr: hdr("", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}, true},
		{"target with a label of 64", &dns.MX{Hdr: hdr("a.example.", dns.TypeMX), Mx: strings.Repeat("m", 64) + "."}, false},
		{"target not fully qualified", &dns.SOA{Hdr: hdr("a.example.", dns.TypeSOA), Ns: "ns.example", Mbox: "h.example."}, false},
		{"nil", nil, false},
	}
	b := NewBuilder()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := samePacking(b, tc.rr); err != nil {
				t.Fatal(err)
			}
			if tc.rr == nil {
				return
			}
			// own: the record's rdata is packed here, not by miekg/dns.
			_, err := packRdata(nil, tc.rr)
			if own := err != errLeftToMiekg; own != tc.own {
				t.Errorf("packed here: %t, want %t", own, tc.own)
			}
		})
	}
}

// TestPackRRRandom compares packRR with dns.PackRR on random records whose
// names and strings mix plain bytes, dots, escapes and upper case, with
// labels and strings around their length limits.
func TestPackRRRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := NewBuilder()
	for i := range 20000 {
		rr := randomRR(r)
		if err := samePacking(b, rr); err != nil {
			t.Fatalf("record %d, %q: %v", i, rr.String(), err)
		}
	}
}

// randomRR returns a record of a type packRR handles, with random fields.
func randomRR(r *rand.Rand) dns.RR {
	h := dns.RR_Header{Name: randomName(r), Class: uint16(r.IntN(5)), Ttl: r.Uint32()}
	switch r.IntN(10) {
	case 0:
		ip := make(net.IP, []int{0, 4, 16, 16}[r.IntN(4)])
		for k := range ip {
			ip[k] = byte(r.Uint32())
		}
		if len(ip) == 16 && r.IntN(2) == 0 {
			ip = net.IPv4(ip[0], ip[1], ip[2], ip[3]) // v4-mapped, as net.ParseIP makes it
		}
		if len(ip) == 16 && ip.To4() == nil {
			return &dns.AAAA{Hdr: h, AAAA: ip}
		}
		return &dns.A{Hdr: h, A: ip}
	case 1:
		return &dns.CNAME{Hdr: h, Target: randomName(r)}
	case 2:
		return &dns.MX{Hdr: h, Preference: uint16(r.Uint32()), Mx: randomName(r)}
	case 3:
		return &dns.SRV{Hdr: h, Priority: 1, Weight: 2, Port: 3, Target: randomName(r)}
	case 4:
		return &dns.SOA{Hdr: h, Ns: randomName(r), Mbox: randomName(r), Serial: r.Uint32(), Minttl: r.Uint32()}
	case 5:
		txt := make([]string, r.IntN(4))
		for k := range txt {
			txt[k] = randomString(r, 250+r.IntN(2)*r.IntN(10), `ab\".`)
		}
		return &dns.TXT{Hdr: h, Txt: txt}
	case 6:
		return &dns.DS{Hdr: h, KeyTag: 1, Algorithm: 13, DigestType: 2, Digest: randomString(r, 8, "0123456789abcdefABCDEFg")}
	case 7:
		sig := make([]byte, r.IntN(80))
		for k := range sig {
			sig[k] = byte(r.Uint32())
		}
		s := base64.StdEncoding.EncodeToString(sig)
		if r.IntN(4) == 0 && len(s) > 0 {
			s = s[:r.IntN(len(s))] // truncated: often not base64
		}
		return &dns.RRSIG{Hdr: h, TypeCovered: 1, Algorithm: 13, Labels: 2, SignerName: randomName(r), Signature: s}
	case 8:
		types := make([]uint16, r.IntN(6))
		for k := range types {
			types[k] = uint16(r.IntN(3))<<8 | uint16(r.IntN(256))
		}
		if r.IntN(2) == 0 {
			slices.Sort(types)
		}
		return &dns.NSEC{Hdr: h, NextDomain: randomName(r), TypeBitMap: types}
	}
	return &dns.DNSKEY{Hdr: h, Flags: 257, Protocol: 3, Algorithm: 13, PublicKey: base64.StdEncoding.EncodeToString([]byte(randomString(r, 40, "xyz")))}
}

// randomName returns a name of a few labels, mostly plain, sometimes with
// escapes, empty labels, labels of 63 and 64 bytes, or no final dot.
func randomName(r *rand.Rand) string {
	if r.IntN(20) == 0 {
		return [...]string{"", ".", "..", "a", `\`, `a\.`}[r.IntN(6)]
	}
	var sb strings.Builder
	for range 1 + r.IntN(4) {
		n := 1 + r.IntN(12)
		if r.IntN(10) == 0 {
			n = 62 + r.IntN(4)
		}
		alphabet := "abcXYZ-09"
		if r.IntN(8) == 0 {
			alphabet = `ab\.1`
		}
		sb.WriteString(randomString(r, n, alphabet))
		sb.WriteByte('.')
	}
	if r.IntN(30) == 0 {
		return strings.TrimSuffix(sb.String(), ".")
	}
	return sb.String()
}

func randomString(r *rand.Rand, n int, alphabet string) string {
	b := make([]byte, n)
	for k := range b {
		b[k] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// TestBuildMatchesPackBuffer builds entries of the reference workload's
// variants twice: as the miss path does, with the question name it asked,
// and with every record first turned into its RFC 3597 form, which only
// miekg/dns packs, and no question name known. The entries must be equal.
func TestBuildMatchesPackBuffer(t *testing.T) {
	b, ref := NewBuilder(), NewBuilder()
	var name [dnsmsg.MaxNameLen]byte
	for _, v := range []workload.Variant{workload.Plain, workload.CNAME | workload.DNSSEC, workload.ECS} {
		for i := range 300 {
			m := workload.Reply(i, v)
			l, err := dns.PackDomainName(m.Question[0].Name, name[:], 0, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			key := AppendKey(nil, name[:l], m.Question[0].Qtype, m.Question[0].Qclass, false)
			// An entry TTL under the records' drops theirs; one over
			// them keeps them (recTTLIsEntry), TTL bytes compared too.
			for _, ttl := range []uint32{2, math.MaxUint32} {
				got, err := b.Build(m, key, m.Question[0].Name, 1, ttl, 0, 3, maxRecordBytes)
				if err != nil {
					t.Fatalf("%s %d: %v", v, i, err)
				}
				want, err := ref.Build(asRFC3597(t, m), key, "", 1, ttl, 0, 3, maxRecordBytes)
				if err != nil {
					t.Fatalf("%s %d, RFC 3597: %v", v, i, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s %d, entry TTL %d: entry\n%x\nwant\n%x", v, i, ttl, got, want)
				}
			}
		}
	}
}

// asRFC3597 returns a copy of m whose records are *dns.RFC3597, OPT aside
// (its type decides what the message's EDNS is).
func asRFC3597(t *testing.T, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := m.Copy()
	for _, rrs := range [][]dns.RR{c.Answer, c.Ns, c.Extra} {
		for k, rr := range rrs {
			if rr.Header().Rrtype == dns.TypeOPT {
				continue
			}
			u := new(dns.RFC3597)
			if err := u.ToRFC3597(rr); err != nil {
				t.Fatal(err)
			}
			rrs[k] = u
		}
	}
	return c
}

// TestBuildErrorsInPackBufferOrder checks that build fails where
// Msg.PackBuffer failed, before the errors of its own: a record miekg/dns
// cannot pack anywhere in the message wins over an earlier record the entry
// refuses, and the question and RCODE are checked though not packed.
func TestBuildErrorsInPackBufferOrder(t *testing.T) {
	key := AppendKey(nil, []byte("\x01a\x07example\x00"), dns.TypeA, dns.ClassINET, false)
	ok := &dns.A{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)}
	badRdata := &dns.CNAME{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}}
	unpackable := &dns.A{Hdr: dns.RR_Header{Name: "a.example", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)}
	msg := func(rcode int, qname string, answer ...dns.RR) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(qname, dns.TypeA)
		m.Rcode, m.Answer = rcode, answer
		return m
	}
	tests := []struct {
		name string
		m    *dns.Msg
		want error
	}{
		{"bad rdata", msg(0, "a.example.", ok, badRdata), errBadRdata},
		{"A of 3 bytes", msg(0, "a.example.", ok, &dns.RFC3597{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, Rdata: "010203"}), errBadRdata},
		{"bad rdata, then a record miekg/dns refuses", msg(0, "a.example.", badRdata, unpackable), dns.ErrFqdn},
		{"extended RCODE without OPT", msg(16, "a.example.", ok), dns.ErrExtendedRcode},
		{"RCODE out of range", msg(0x1000, "a.example.", ok), dns.ErrRcode},
		{"question miekg/dns refuses", msg(0, "a..example.", ok), dns.ErrRdata},
		// PackBuffer packed it, and the entry got a record it could not read.
		{"record without an owner", msg(0, "a.example.", ok, &dns.A{Hdr: dns.RR_Header{Rrtype: dns.TypeA, Class: dns.ClassINET}}), errNoOwner},
	}
	b := NewBuilder()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Build(tc.m, key, "", 0, 60, 0, 0, maxRecordBytes)
			if !errors.Is(err, tc.want) {
				t.Fatalf("build: %v, want %v", err, tc.want)
			}
			if _, err := tc.m.Copy().PackBuffer(nil); (err == nil) != (tc.want == errBadRdata || tc.want == errNoOwner) {
				t.Fatalf("PackBuffer: %v: the case does not test what it says", err)
			}
		})
	}
}

// TestPackNameMatchesMiekg compares packName with dns.PackDomainName into
// buffers of the query's 255 bytes and shorter: the same length, bytes and
// failures, ErrBuf for names that do not fit included.
func TestPackNameMatchesMiekg(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	names := []string{"", ".", "a.", "a", "A.b.", `a\.b.`, `\065.`, `a\`, "..", ".a.", longName, "c." + longName, strings.Repeat("a", 64) + "."}
	for range 5000 {
		names = append(names, randomName(r))
	}
	for _, s := range names {
		for _, size := range []int{dnsmsg.MaxNameLen, len(s) + 1, len(s), 3} {
			got, want := make([]byte, size), make([]byte, size)
			n, err := dnsmsg.PackName(s, got)
			wn, werr := dns.PackDomainName(s, want, 0, nil, false)
			if (err == nil) != (werr == nil) || err == nil && (n != wn || !bytes.Equal(got[:n], want[:wn])) {
				t.Fatalf("packName(%q) into %d bytes: %d %x %v, dns.PackDomainName: %d %x %v", s, size, n, got[:min(n, size)], err, wn, want[:min(wn, size)], werr)
			}
		}
	}
}

// TestBuildAllocatesNothing builds entries with every type packRR handles:
// the builder's buffers, once grown, are all an insert's packing needs.
func TestBuildAllocatesNothing(t *testing.T) {
	m := workload.Reply(7, workload.CNAME|workload.DNSSEC)
	m.Ns = []dns.RR{
		mustRR(t, "example. 300 IN SOA ns.example. hostmaster.example. 2026 7200 3600 1209600 300"),
		mustRR(t, "a.example. 300 IN NSEC b.example. A NS SOA MX TXT AAAA RRSIG NSEC DNSKEY TYPE1234"),
		mustRR(t, "example. 300 IN NS ns1.example."),
		mustRR(t, "example. 300 IN DS 12345 13 2 2BB183AF5F22588179A53B0A98631FAD1A292118F0AB4C2D3A1A6B6B8B0AB27E"),
	}
	m.Extra = append(m.Extra,
		mustRR(t, "example. 300 IN DNSKEY 257 3 13 mdsswUyr3DPW132mOi8V9xESWE8jTo0dxCjjnopKl+GqJxpVXckHAeF+KkxLbxILfDLUT0rAK9iUzy1L53eKGQ=="),
		mustRR(t, "_sip._udp.example. 300 IN SRV 10 60 5060 sip.example."),
		mustRR(t, "example. 300 IN MX 10 mail.example."),
		mustRR(t, "1.2.0.192.in-addr.arpa. 300 IN PTR host.example."),
		mustRR(t, "example. 300 IN DNAME example.net."),
		mustRR(t, `a.example. 300 IN TXT "v=spf1 -all" "second"`),
		mustRR(t, "a.example. 300 IN AAAA 2001:db8::1"),
	)
	var name [dnsmsg.MaxNameLen]byte
	l, err := dns.PackDomainName(m.Question[0].Name, name[:], 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	key := AppendKey(nil, name[:l], m.Question[0].Qtype, m.Question[0].Qclass, false)
	b := NewBuilder()
	build := func() {
		if _, err := b.Build(m, key, "", 0, 60, 0, 0, maxRecordBytes); err != nil {
			t.Fatal(err)
		}
	}
	build() // grow the buffers
	if n := testing.AllocsPerRun(100, build); n != 0 {
		t.Errorf("build allocates %.1f times", n)
	}
}

// FuzzPackRR compares packRR with dns.PackRR on records unpacked from
// arbitrary bytes: names with any byte (escaped in presentation form),
// strings, bitmaps and rdata as miekg/dns reads them off the wire.
func FuzzPackRR(f *testing.F) {
	for _, s := range []string{
		"a.example. 300 IN A 192.0.2.1",
		`a\.b\000.example. 300 IN TXT "a\"b" "\255"`,
		"a.example. 300 IN NSEC b.example. A NS SOA RRSIG NSEC TYPE1234",
		"a.example. 300 IN RRSIG A 13 2 300 20270101000000 20260101000000 12345 example. oJB1W6WNGv+ldvQ3WDG0MQkg5IEhjRip8WTrPYGv07h108dUKGMeDPKijVCHX3DDKdfb+v6oB9wfuh3DTJXUAw==",
		"example. 300 IN SOA ns.example. hostmaster.example. 2026 7200 3600 1209600 300",
		"_sip._udp.example. 300 IN SRV 10 60 5060 sip.example.",
	} {
		rr, err := dns.NewRR(s)
		if err != nil {
			f.Fatal(err)
		}
		buf := make([]byte, 1024)
		n, err := dns.PackRR(rr, buf, 0, nil, false)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(buf[:n])
	}
	b := NewBuilder()
	f.Fuzz(func(t *testing.T, wire []byte) {
		rr, _, err := dns.UnpackRR(wire, 0)
		if err != nil || rr == nil {
			return
		}
		if err := samePacking(b, rr); err != nil {
			t.Fatalf("%q: %v", rr.String(), err)
		}
	})
}

// BenchmarkPackName times packing the question names of the reference
// workload, as readMsg does for every request.
func BenchmarkPackName(b *testing.B) {
	names := workload.NewNames(1 << 10)
	var buf [dnsmsg.MaxNameLen]byte
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := dnsmsg.PackName(names.Name(i%(1<<10)), buf[:]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// TestBuildLeavesOutDNSSEC: without FlagDNSSEC the builder leaves out the
// records only DO clients get, keeps those the question asks for, and
// marks the entry FlagDNSSEC when it left nothing out; with the flag it
// keeps every record.
func TestBuildLeavesOutDNSSEC(t *testing.T) {
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := rr("s.example. 300 IN A 192.0.2.1")
	sig := rr("s.example. 300 IN RRSIG A 13 2 300 20300101000000 20200101000000 12345 example. AAAA")
	soa := rr("example. 300 IN SOA ns.example. host.example. 1 7200 3600 1209600 300")
	nsec := rr("s.example. 60 IN NSEC t.example. A RRSIG NSEC")
	ds := rr("child.example. 300 IN DS 12345 13 2 0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF")
	ns := rr("child.example. 300 IN NS ns.child.example.")
	for _, tc := range []struct {
		name     string
		qtype    uint16
		an, auth []dns.RR
		keep     bool
		records  int  // records in the entry
		dnssec   bool // FlagDNSSEC on the entry
		short    bool // FlagShortProof on the entry
	}{
		{"signed answer", dns.TypeA, []dns.RR{a, sig}, nil, false, 1, false, false},
		{"signed answer, kept", dns.TypeA, []dns.RR{a, sig}, nil, true, 2, true, false},
		{"NODATA with a short NSEC", dns.TypeMX, nil, []dns.RR{soa, nsec}, false, 1, false, false},
		{"NODATA with a short NSEC, kept", dns.TypeMX, nil, []dns.RR{soa, nsec}, true, 2, true, true},
		{"referral with DS", dns.TypeA, nil, []dns.RR{ns, ds}, false, 1, false, false},
		{"RRSIG asked for", dns.TypeRRSIG, []dns.RR{sig}, nil, false, 1, true, false},
		{"unsigned", dns.TypeA, []dns.RR{a}, nil, false, 1, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := new(dns.Msg)
			m.SetQuestion("s.example.", tc.qtype)
			m.Response, m.Answer, m.Ns = true, tc.an, tc.auth
			key, err := KeyFor("s.example.", tc.qtype, dns.ClassINET, false)
			if err != nil {
				t.Fatal(err)
			}
			var flags uint16
			if tc.keep {
				flags = FlagDNSSEC
			}
			e, err := NewBuilder().Build(m, key, "s.example.", 1, 300, 0, flags, maxRecordBytes)
			if err != nil {
				t.Fatal(err)
			}
			var c [3]int
			if e.Records(&c); c[0]+c[1]+c[2] != tc.records {
				t.Errorf("%d records, want %d", c[0]+c[1]+c[2], tc.records)
			}
			if e.HoldsDNSSEC() != tc.dnssec || e.Flags()&FlagShortProof != 0 != tc.short {
				t.Errorf("HoldsDNSSEC %v, short proof %v; want %v, %v", e.HoldsDNSSEC(), e.Flags()&FlagShortProof != 0, tc.dnssec, tc.short)
			}
			if err := Check(e); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestBuildPassedKeepsSignatureTTLs: an entry built at 0, a reply passed on
// and not stored, keeps its RRSIGs' TTLs as the upstream sent them, also
// for a signature expiring past 2038, whose expiration read as a serial
// number from 0 is in the past; an entry stored now caps them at the
// signature's expiration.
func TestBuildPassedKeepsSignatureTTLs(t *testing.T) {
	sig, err := dns.NewRR("s.example. 300 IN RRSIG A 13 2 300 20400101000000 20200101000000 12345 example. AAAA")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := dns.NewRR("s.example. 300 IN A 192.0.2.1")
	m := new(dns.Msg)
	m.SetQuestion("s.example.", dns.TypeA)
	m.Response, m.Answer = true, []dns.RR{a, sig}
	key, err := KeyFor("s.example.", dns.TypeA, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	exp := sig.(*dns.RRSIG).Expiration
	for _, tc := range []struct {
		stored uint32
		want   uint32
	}{
		{0, 300},         // passed on
		{exp - 100, 100}, // stored 100 s before it expires
	} {
		e, err := NewBuilder().Build(m, key, "s.example.", tc.stored, 300, 0, FlagDNSSEC, maxRecordBytes)
		if err != nil {
			t.Fatal(err)
		}
		var c [3]int
		off := e.Records(&c)
		var r Record
		for range c[0] {
			if off = e.Record(off, &r); r.Type == dns.TypeRRSIG && r.TTL != tc.want {
				t.Errorf("built at %d: RRSIG TTL %d, want %d", tc.stored, r.TTL, tc.want)
			}
		}
	}
}
