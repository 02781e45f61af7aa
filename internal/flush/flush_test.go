package flush

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/miekg/dns"
)

func wire(t *testing.T, name string) []byte {
	t.Helper()
	var buf [dnsmsg.MaxNameLen]byte
	n, err := dnsmsg.PackName(dns.Fqdn(name), buf[:])
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(buf[:n])
}

// built returns an entry for name/qtype of rcode, stored at 1000 for ttl.
func built(t *testing.T, name string, qtype uint16, rcode int, ttl uint32, flags uint16) entry.Entry {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.Response, m.Rcode = true, rcode
	key, err := entry.KeyFor(name, qtype, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	e, err := entry.NewBuilder().Build(m, key, m.Question[0].Name, 1000, ttl, 0, flags|uint16(rcode), entry.MaxLen)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(e)
}

func TestCovers(t *testing.T) {
	a := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, 60, 0)
	nx := built(t, "gone.example.org", dns.TypeA, dns.RcodeNameError, 60, entry.FlagDenial)
	fail := built(t, "www.example.com", dns.TypeMX, dns.RcodeServerFailure, 5, 0)
	for _, tc := range []struct {
		name string
		f    Flush
		e    entry.Entry
		now  int64
		want bool
	}{
		{"name, every type", Flush{Scope: Names, Names: [][]byte{wire(t, "www.example.org")}}, a, 0, true},
		{"name, its type", Flush{Scope: Names, Names: [][]byte{wire(t, "www.example.org")}, Types: []uint16{dns.TypeAAAA, dns.TypeA}}, a, 0, true},
		{"name, another type", Flush{Scope: Names, Names: [][]byte{wire(t, "www.example.org")}, Types: []uint16{dns.TypeAAAA}}, a, 0, false},
		{"another name", Flush{Scope: Names, Names: [][]byte{wire(t, "example.org")}}, a, 0, false},
		{"second of two names", Flush{Scope: Names, Names: [][]byte{wire(t, "x.org"), wire(t, "gone.example.org")}}, nx, 0, true},
		{"zone above", Flush{Scope: Zones, Names: [][]byte{wire(t, "example.org")}}, a, 0, true},
		{"zone is the name", Flush{Scope: Zones, Names: [][]byte{wire(t, "www.example.org")}}, a, 0, true},
		{"zone at no label boundary", Flush{Scope: Zones, Names: [][]byte{wire(t, "ww.example.org")}}, a, 0, false},
		{"root zone", Flush{Scope: Zones, Names: [][]byte{{0}}}, fail, 0, true},
		{"negative: NXDOMAIN", Flush{Scope: Negative}, nx, 0, true},
		{"negative: SERVFAIL", Flush{Scope: Negative}, fail, 0, true},
		{"negative: an answer", Flush{Scope: Negative}, a, 0, false},
		{"expired: not yet", Flush{Scope: Expired}, a, 1059, false},
		{"expired: at its end", Flush{Scope: Expired}, a, 1060, true},
		{"all", Flush{Scope: All}, a, 0, true},
	} {
		if got := tc.f.Covers(tc.e, tc.now); got != tc.want {
			t.Errorf("%s: Covers = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, f := range []Flush{
		{Scope: Names, Names: [][]byte{wire(t, "www.example.org"), wire(t, "a.b")}, Types: []uint16{dns.TypeA, dns.TypeSRV}},
		{Scope: Zones, Names: [][]byte{{0}}},
		{Scope: Negative},
		{Scope: Expired},
		{Scope: All},
	} {
		got, err := Unmarshal(f.Marshal(nil))
		if err != nil {
			t.Fatalf("%s: %v", f.String(), err)
		}
		if got.Scope != f.Scope || !slices.Equal(got.Types, f.Types) || !slices.EqualFunc(got.Names, f.Names, bytes.Equal) {
			t.Errorf("round trip of %s gave %s", f.String(), got.String())
		}
	}
}

func TestUnmarshalLowercases(t *testing.T) {
	f := Flush{Scope: Names, Names: [][]byte{[]byte("\x03WWW\x07Example\x03org\x00")}}
	got, err := Unmarshal(f.Marshal(nil))
	if err != nil {
		t.Fatal(err)
	}
	if want := wire(t, "www.example.org"); !bytes.Equal(got.Names[0], want) {
		t.Errorf("name %q, want %q", got.Names[0], want)
	}
}

func TestUnmarshalMalformed(t *testing.T) {
	good := (&Flush{Scope: Names, Names: [][]byte{wire(t, "www.example.org")}, Types: []uint16{dns.TypeA}}).Marshal(nil)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"short header", good[:5]},
		{"other version", append([]byte{9}, good[1:]...)},
		{"scope 0", append([]byte{version, 0}, good[2:]...)},
		{"scope past All", append([]byte{version, byte(All) + 1}, good[2:]...)},
		{"cut in types", good[:headerLen+1]},
		{"cut in a name", good[:len(good)-2]},
		{"bytes after", append(slices.Clone(good), 0)},
		{"pointer for a name", append(slices.Clone(good[:headerLen+2]), 0xC0, 0x0C)},
		{"names without names", (&Flush{Scope: Names}).Marshal(nil)},
		{"all with names", (&Flush{Scope: All, Names: [][]byte{{0}}}).Marshal(nil)},
		{"too many names", []byte{version, byte(Names), 0, 0, 0xFF, 0xFF}},
	} {
		if _, err := Unmarshal(tc.b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", tc.name, err)
		}
	}
}

func TestFence(t *testing.T) {
	a := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, 60, 0)
	b := built(t, "www.example.com", dns.TypeA, dns.RcodeSuccess, 60, 0)
	var fc Fence
	put := 0
	store := func(gen uint64, e entry.Entry) bool { return fc.Store(gen, e, func() { put++ }) }

	before := fc.Gen()
	if !store(before, a) {
		t.Fatal("no flush began: the put must run")
	}
	zone := Flush{Scope: Zones, Names: [][]byte{wire(t, "example.org")}}
	fc.Begin(func(e entry.Entry) bool { return zone.Covers(e, 0) })
	if store(before, a) {
		t.Error("a fetch begun before a flush that covers its entry stored it")
	}
	if !store(before, b) {
		t.Error("a fetch begun before a flush that does not cover its entry did not store it")
	}
	if !store(fc.Gen(), a) {
		t.Error("a fetch begun after the flush did not store its entry")
	}
	if put != 3 {
		t.Errorf("put ran %d times, want 3", put)
	}
	for range 100 {
		fc.Begin(func(entry.Entry) bool { return false })
	}
	if !store(before, b) {
		t.Error("a fetch begun before 100 flushes, none covering its entry, did not store it (a warm-up's fill lasts through as many)")
	}
	if store(before, a) {
		t.Error("a fetch begun before a flush that covers its entry stored it, 100 flushes later")
	}
	for range maxRecords {
		fc.Begin(func(entry.Entry) bool { return false })
	}
	if store(before, b) {
		t.Error("a fetch older than every flush kept stored its entry")
	}
}
