package workload

import (
	"bytes"
	"encoding/base64"
	"math"
	"testing"

	"github.com/miekg/dns"
)

const sample = 100_000

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDeterministic(t *testing.T) {
	names := NewNames(1000)
	for _, v := range []Variant{Plain, CNAME | DNSSEC | ECS} {
		for i := range 1000 {
			a, b := pack(t, Reply(i, v)), pack(t, Reply(i, v))
			if !bytes.Equal(a, b) {
				t.Fatalf("Reply(%d, %s) differs between calls", i, v)
			}
			q := Question(i)
			if got := Reply(i, v).Question[0]; got != q {
				t.Fatalf("Reply(%d).Question = %v, Question(%d) = %v", i, got, i, q)
			}
			if n := names.Name(i); n != q.Name {
				t.Fatalf("Names.Name(%d) = %q, want %q", i, n, q.Name)
			}
		}
	}
	// The reference entries are the same in every variant.
	for i := range 1000 {
		plain, signed := Reply(i, Plain), Reply(i, DNSSEC)
		for k, rr := range plain.Answer {
			if rr.String() != signed.Answer[k].String() {
				t.Fatalf("entry %d: record %d differs in the dnssec variant", i, k)
			}
		}
	}
	// Pin a few values, so that a change to the generator is seen: every
	// figure quoted on the workload would move with it.
	if got, want := Name(0), "zymtqfsjxevynaju.gesyv.net."; got != want {
		t.Errorf("Name(0) = %q, want %q", got, want)
	}
}

func TestRequest(t *testing.T) {
	for _, v := range []Variant{Plain, DNSSEC, ECS} {
		m := NewRequest(0, v)
		for i := range 2000 {
			SetRequest(m, i, v, Name(i))
			if !bytes.Equal(pack(t, m), pack(t, NewRequest(i, v))) {
				t.Fatalf("SetRequest(%d, %s) differs from NewRequest", i, v)
			}
		}
		names := NewNames(10)
		if n := testing.AllocsPerRun(100, func() { SetRequest(m, 7, v, names.Name(7)) }); n != 0 {
			t.Errorf("SetRequest(%s) allocates %v times", v, n)
		}
	}
}

func TestQtypeMix(t *testing.T) {
	count := map[uint16]int{}
	for i := range sample {
		count[Qtype(i)]++
	}
	for qt, want := range map[uint16]float64{dns.TypeA: 0.56, dns.TypeAAAA: 0.25, dns.TypeTXT: 0.19} {
		got := float64(count[qt]) / sample
		if math.Abs(got-want) > 0.01 {
			t.Errorf("%s: %.3f of entries, want %.2f", dns.TypeToString[qt], got, want)
		}
	}
}

func TestEntries(t *testing.T) {
	seen := make(map[string]bool, sample)
	var nameBytes, payload int
	for i := range sample {
		m := Reply(i, Plain)
		q := m.Question[0]
		if seen[q.Name] {
			t.Fatalf("entry %d: qname %s repeats", i, q.Name)
		}
		seen[q.Name] = true
		nameBytes += len(q.Name)
		if n := len(m.Answer); n < 1 || n > 4 {
			t.Fatalf("entry %d: %d records", i, n)
		}
		for _, rr := range m.Answer {
			h := rr.Header()
			if h.Name != q.Name || h.Rrtype != q.Qtype || h.Ttl != TTL {
				t.Fatalf("entry %d: record %s does not answer %s", i, rr, q.Name)
			}
			if txt, ok := rr.(*dns.TXT); ok {
				if n := len(txt.Txt[0]) + 1; n < 64 || n > 224 {
					t.Fatalf("entry %d: TXT rdata of %d bytes", i, n)
				}
			}
		}
		if n := len(pack(t, m)); n > UDPSize {
			t.Fatalf("entry %d: reply of %d bytes", i, n)
		}
		payload += Payload(i)
	}
	avg := float64(payload) / sample
	t.Logf("average qname %.1f characters, payload %.1f bytes per entry", float64(nameBytes)/sample, avg)
	if avg < 110 || avg > 126 {
		t.Errorf("average payload %.1f bytes, want about 118", avg)
	}
}

func TestVariants(t *testing.T) {
	const n = 20_000
	cnames := 0
	for i := range n {
		m := Reply(i, CNAME|DNSSEC|ECS)
		sets := map[string]bool{}
		sigs := map[string]int{}
		for _, rr := range m.Answer {
			h := rr.Header()
			if sig, ok := rr.(*dns.RRSIG); ok {
				b, err := base64.StdEncoding.DecodeString(sig.Signature)
				if err != nil || len(b) != 64 || sig.Algorithm != dns.ECDSAP256SHA256 {
					t.Fatalf("entry %d: bad RRSIG %s", i, sig)
				}
				sigs[h.Name+dns.TypeToString[sig.TypeCovered]]++
				continue
			}
			if c, ok := rr.(*dns.CNAME); ok {
				cnames++
				if m.Answer[len(m.Answer)-1].Header().Name != c.Target {
					t.Fatalf("entry %d: the CNAME target does not own the final records", i)
				}
			}
			sets[h.Name+dns.TypeToString[h.Rrtype]] = true
		}
		for set := range sets {
			if sigs[set] != 1 {
				t.Fatalf("entry %d: RRset %s has %d RRSIGs", i, set, sigs[set])
			}
		}
		e := m.IsEdns0().Option[0].(*dns.EDNS0_SUBNET)
		p := Subnet(Client(i))
		if int(e.SourceScope) != p.Bits() || (p.Addr().Is4()) != (e.Family == 1) {
			t.Fatalf("entry %d: ECS %s for client subnet %s", i, e, p)
		}
		if l := len(pack(t, m)); l > UDPSize {
			t.Fatalf("entry %d: reply of %d bytes", i, l)
		}
	}
	if got := float64(cnames) / n; math.Abs(got-0.15) > 0.01 {
		t.Errorf("%.3f of entries through a CNAME, want 0.15", got)
	}
	seen := map[string]bool{}
	for j := range Clients {
		seen[Subnet(j).String()] = true
	}
	if len(seen) != Clients {
		t.Errorf("%d distinct client subnets, want %d", len(seen), Clients)
	}
}

func TestParseVariant(t *testing.T) {
	for s, want := range map[string]Variant{"": Plain, "plain": Plain, "cname": CNAME, "ecs, dnssec": DNSSEC | ECS} {
		v, err := ParseVariant(s)
		if err != nil || v != want {
			t.Errorf("ParseVariant(%q) = %s, %v, want %s", s, v, err, want)
		}
		if again, _ := ParseVariant(v.String()); again != v {
			t.Errorf("ParseVariant(%q) = %s", v.String(), again)
		}
	}
	if _, err := ParseVariant("zipf"); err == nil {
		t.Error("ParseVariant(zipf) succeeded: zipf is a trace, not a variant")
	}
}
