package compactcache

// DNSSEC tests against zones signed in the test with miekg/dns: two zones with
// NSEC chains (ECDSA P-256 and RSA) served by CoreDNS's file plugin in an
// in-process server behind forward, and one zone with an NSEC3 chain (which
// the file plugin does not serve) answered by a validating resolver written
// here. Every test name contains DNSSEC: go test -run DNSSEC .

import (
	"context"
	"crypto"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/forward"
	"github.com/coredns/coredns/plugin/pkg/proxy"
	"github.com/coredns/coredns/plugin/pkg/transport"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// secZoneText is the zone every signed zone starts from; %[1]s is its origin.
const secZoneText = `$ORIGIN %[1]s
$TTL 3600
@        IN SOA   ns hostmaster 2026010101 7200 3600 1209600 300
@        IN NS    ns
@        IN MX    10 mail
ns       IN A     192.0.2.53
mail     IN A     192.0.2.25
www  300 IN A     192.0.2.10
www  300 IN A     192.0.2.11
www      IN AAAA  2001:db8::10
txt      IN TXT   "signed text"
alias    IN CNAME www
*.wild   IN A     192.0.2.77
*.wild   IN TXT   "synthesized"
child    IN NS    ns
`

// secSpec describes a zone to sign.
type secSpec struct {
	origin   string
	alg      uint8
	ksk, zsk int  // key sizes in bits
	nsec3    bool // an NSEC3 chain (SHA-1, no salt, no iterations: RFC 9276) instead of NSEC
	extra    string
	bogus    []string // names whose A RRSIG is corrupted after signing
}

var secSpecs = []secSpec{
	{origin: "ecdsa.example.", alg: dns.ECDSAP256SHA256, ksk: 256, zsk: 256, extra: secBigTXT},
	{origin: "rsa.example.", alg: dns.RSASHA256, ksk: 2048, zsk: 1024, extra: secBigTXT},
	{origin: "nsec3.example.", alg: dns.ECDSAP256SHA256, ksk: 256, zsk: 256, nsec3: true,
		extra: "bogus IN A 192.0.2.66\npartial IN CNAME target.elsewhere.invalid.\n",
		bogus: []string{"bogus"}},
}

// secBigTXT is an RRset that, signed, passes the 1232 bytes of the cache's
// own UDP queries: the upstream truncates it and the cache must retry over TCP.
var secBigTXT = "big IN TXT " + strings.Repeat(`"`+strings.Repeat("x", 240)+`" `, 5) + "\n"

// secZone is a signed zone: records, keys, signatures and denial chain.
type secZone struct {
	origin string
	nsec3  bool
	keys   []*dns.DNSKEY
	rrs    []dns.RR                       // every record, signed, in zone file order
	sets   map[string]map[uint16][]dns.RR // by lowercased owner and type; RRSIGs under TypeRRSIG
	ents   map[string]bool                // empty non-terminals
	hashes []string                       // NSEC3 owner hashes, sorted
	bogus  map[string]bool
}

var secZones struct {
	once  sync.Once
	zones map[string]*secZone
	err   error
}

// secZoneFor returns the signed zone of origin; keys are generated and zones
// signed once per test binary.
func secZoneFor(t *testing.T, origin string) *secZone {
	t.Helper()
	secZones.once.Do(func() {
		secZones.zones = map[string]*secZone{}
		for _, sp := range secSpecs {
			z, err := secSign(sp)
			if err != nil {
				secZones.err = fmt.Errorf("%s: %v", sp.origin, err)
				return
			}
			secZones.zones[sp.origin] = z
		}
	})
	if secZones.err != nil {
		t.Fatal(secZones.err)
	}
	return secZones.zones[origin]
}

func secSign(sp secSpec) (*secZone, error) {
	var recs []dns.RR
	zp := dns.NewZoneParser(strings.NewReader(fmt.Sprintf(secZoneText, sp.origin)+sp.extra), sp.origin, "")
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		recs = append(recs, rr)
	}
	if err := zp.Err(); err != nil {
		return nil, err
	}
	z := &secZone{origin: sp.origin, nsec3: sp.nsec3, sets: map[string]map[uint16][]dns.RR{}, ents: map[string]bool{}, bogus: map[string]bool{}}

	// A KSK that signs the DNSKEY RRset and a ZSK that signs the rest.
	var signers []crypto.Signer
	for _, k := range []struct{ flags, bits int }{{257, sp.ksk}, {256, sp.zsk}} {
		key := &dns.DNSKEY{Hdr: dns.RR_Header{Name: sp.origin, Rrtype: dns.TypeDNSKEY, Class: dns.ClassINET, Ttl: 3600},
			Flags: uint16(k.flags), Protocol: 3, Algorithm: sp.alg}
		// miekg/dns signs with no key whose tag is 0, one key in 65,536:
		// another is drawn.
		var priv crypto.PrivateKey
		for priv == nil || key.KeyTag() == 0 {
			var err error
			if priv, err = key.Generate(k.bits); err != nil {
				return nil, err
			}
		}
		z.keys = append(z.keys, key)
		signers = append(signers, priv.(crypto.Signer))
		recs = append(recs, key)
	}
	// The DS of the delegated child, from a key of its own.
	childKey := &dns.DNSKEY{Hdr: dns.RR_Header{Name: "child." + sp.origin, Rrtype: dns.TypeDNSKEY, Class: dns.ClassINET, Ttl: 3600},
		Flags: 257, Protocol: 3, Algorithm: dns.ECDSAP256SHA256}
	if _, err := childKey.Generate(256); err != nil {
		return nil, err
	}
	recs = append(recs, childKey.ToDS(dns.SHA256))

	// Owner names, types at each, and the zone cuts below the apex.
	types := map[string][]uint16{}
	var names []string
	for _, rr := range recs {
		n := strings.ToLower(rr.Header().Name)
		if _, ok := types[n]; !ok {
			names = append(names, n)
		}
		if !slices.Contains(types[n], rr.Header().Rrtype) {
			types[n] = append(types[n], rr.Header().Rrtype)
		}
	}
	cut := func(n string) bool { return n != sp.origin && slices.Contains(types[n], dns.TypeNS) }
	sort.Slice(names, func(i, j int) bool { return secCanonLess(names[i], names[j]) })

	const denialTTL = 300 // the SOA minimum (RFC 4034 4, RFC 9077)
	if !sp.nsec3 {
		for i, n := range names {
			bitmap := append(slices.Clone(types[n]), dns.TypeNSEC, dns.TypeRRSIG)
			slices.Sort(bitmap)
			recs = append(recs, &dns.NSEC{Hdr: dns.RR_Header{Name: n, Rrtype: dns.TypeNSEC, Class: dns.ClassINET, Ttl: denialTTL},
				NextDomain: names[(i+1)%len(names)], TypeBitMap: bitmap})
		}
	} else {
		recs = append(recs, &dns.NSEC3PARAM{Hdr: dns.RR_Header{Name: sp.origin, Rrtype: dns.TypeNSEC3PARAM, Class: dns.ClassINET, Ttl: 0},
			Hash: dns.SHA1})
		types[sp.origin] = append(types[sp.origin], dns.TypeNSEC3PARAM)
		// Empty non-terminals get NSEC3 records too (RFC 5155 7.1).
		for _, n := range names {
			for p := secParent(n); p != sp.origin && dns.IsSubDomain(sp.origin, p); p = secParent(p) {
				if _, ok := types[p]; !ok {
					z.ents[p] = true
				}
			}
		}
		byHash := map[string]string{}
		for n := range z.ents {
			names = append(names, n)
		}
		for _, n := range names {
			h := dns.HashName(n, dns.SHA1, 0, "")
			byHash[h] = n
			z.hashes = append(z.hashes, h)
		}
		sort.Strings(z.hashes)
		for i, h := range z.hashes {
			n := byHash[h]
			var bitmap []uint16
			if !z.ents[n] {
				bitmap = slices.Clone(types[n])
				if !cut(n) || slices.Contains(bitmap, dns.TypeDS) {
					bitmap = append(bitmap, dns.TypeRRSIG)
				}
			}
			slices.Sort(bitmap)
			recs = append(recs, &dns.NSEC3{Hdr: dns.RR_Header{Name: strings.ToLower(h) + "." + sp.origin, Rrtype: dns.TypeNSEC3, Class: dns.ClassINET, Ttl: denialTTL},
				Hash: dns.SHA1, HashLength: 20, NextDomain: z.hashes[(i+1)%len(z.hashes)], TypeBitMap: bitmap})
		}
	}

	// Sign every authoritative RRset: all but the NS RRset at a cut.
	now := time.Now()
	var order []string
	rrsets := map[string][]dns.RR{}
	for _, rr := range recs {
		k := strings.ToLower(rr.Header().Name) + "/" + dns.TypeToString[rr.Header().Rrtype]
		if _, ok := rrsets[k]; !ok {
			order = append(order, k)
		}
		rrsets[k] = append(rrsets[k], rr)
	}
	for _, k := range order {
		set := rrsets[k]
		h := set[0].Header()
		if h.Rrtype == dns.TypeNS && cut(strings.ToLower(h.Name)) {
			continue
		}
		i := 1
		if h.Rrtype == dns.TypeDNSKEY {
			i = 0
		}
		sig := &dns.RRSIG{Hdr: dns.RR_Header{Ttl: h.Ttl}, Algorithm: sp.alg, KeyTag: z.keys[i].KeyTag(), SignerName: sp.origin,
			Inception: uint32(now.Add(-time.Hour).Unix()), Expiration: uint32(now.Add(30 * 24 * time.Hour).Unix())}
		if err := sig.Sign(signers[i], set); err != nil {
			return nil, fmt.Errorf("signing %s: %v", k, err)
		}
		if err := sig.Verify(z.keys[i], set); err != nil {
			return nil, fmt.Errorf("verifying %s: %v", k, err)
		}
		for _, b := range sp.bogus {
			if k == b+"."+sp.origin+"/A" {
				raw, _ := base64.StdEncoding.DecodeString(sig.Signature)
				raw[len(raw)/2] ^= 0xff
				sig.Signature = base64.StdEncoding.EncodeToString(raw)
				z.bogus[b+"."+sp.origin] = true
			}
		}
		recs = append(recs, sig)
	}
	z.rrs = recs
	for _, rr := range recs {
		n := strings.ToLower(rr.Header().Name)
		if z.sets[n] == nil {
			z.sets[n] = map[uint16][]dns.RR{}
		}
		z.sets[n][rr.Header().Rrtype] = append(z.sets[n][rr.Header().Rrtype], rr)
	}
	return z, nil
}

// secCanonLess orders names canonically (RFC 4034 6.1) for names of plain
// labels: by labels from the right, each compared as lowercase bytes.
func secCanonLess(a, b string) bool {
	la, lb := dns.SplitDomainName(strings.ToLower(a)), dns.SplitDomainName(strings.ToLower(b))
	for i := 1; i <= min(len(la), len(lb)); i++ {
		if x, y := la[len(la)-i], lb[len(lb)-i]; x != y {
			return x < y
		}
	}
	return len(la) < len(lb)
}

func secParent(n string) string { return n[strings.IndexByte(n, '.')+1:] }

// text is the zone in master file form, for the file plugin.
func (z *secZone) text() string {
	var b strings.Builder
	for _, rr := range z.rrs {
		b.WriteString(rr.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// withSigs returns the RRset of owner and type t followed by its signatures.
func (z *secZone) withSigs(owner string, t uint16) []dns.RR {
	rrs := slices.Clone(z.sets[owner][t])
	for _, s := range z.sets[owner][dns.TypeRRSIG] {
		if s.(*dns.RRSIG).TypeCovered == t {
			rrs = append(rrs, s)
		}
	}
	return rrs
}

// nsec3 returns the signed NSEC3 record that matches name (cover false) or
// covers it (cover true).
func (z *secZone) nsec3For(name string, cover bool) []dns.RR {
	h := dns.HashName(name, dns.SHA1, 0, "")
	i := sort.SearchStrings(z.hashes, h)
	if cover || i == len(z.hashes) || z.hashes[i] != h {
		i = (i + len(z.hashes) - 1) % len(z.hashes)
	}
	return z.withSigs(strings.ToLower(z.hashes[i])+"."+z.origin, dns.TypeNSEC3)
}

// lookup answers name/qtype from the NSEC3 zone as an authoritative server
// does (RFC 4035 3.1, RFC 5155 7.2), minus referrals, which the tests do not
// ask for.
func (z *secZone) lookup(name string, qtype uint16) (answer, ns []dns.RR, rcode int) {
	denial := func(proofs ...[]dns.RR) []dns.RR {
		out := z.withSigs(z.origin, dns.TypeSOA)
		seen := map[string]bool{}
		for _, p := range proofs {
			if owner := p[0].Header().Name; !seen[owner] {
				seen[owner] = true
				out = append(out, p...)
			}
		}
		return out
	}
	if types, ok := z.sets[name]; ok {
		if c := types[dns.TypeCNAME]; c != nil && qtype != dns.TypeCNAME {
			answer = z.withSigs(name, dns.TypeCNAME)
			if target := strings.ToLower(c[0].(*dns.CNAME).Target); z.sets[target] != nil {
				answer = append(answer, z.withSigs(target, qtype)...)
			}
			return answer, nil, dns.RcodeSuccess
		}
		if qtype == dns.TypeRRSIG && types[qtype] != nil {
			return slices.Clone(types[qtype]), nil, dns.RcodeSuccess
		}
		if types[qtype] != nil {
			return z.withSigs(name, qtype), nil, dns.RcodeSuccess
		}
		return nil, denial(z.nsec3For(name, false)), dns.RcodeSuccess
	}
	if z.ents[name] {
		return nil, denial(z.nsec3For(name, false)), dns.RcodeSuccess
	}
	// The closest encloser and the next closer name (RFC 5155 7.2.1).
	next, ce := name, secParent(name)
	for z.sets[ce] == nil && !z.ents[ce] {
		next, ce = ce, secParent(ce)
	}
	wild := "*." + ce
	if z.sets[wild] == nil {
		return nil, denial(z.nsec3For(ce, false), z.nsec3For(next, true), z.nsec3For(wild, true)), dns.RcodeNameError
	}
	if z.sets[wild][qtype] == nil {
		return nil, denial(z.nsec3For(ce, false), z.nsec3For(next, true), z.nsec3For(wild, false)), dns.RcodeSuccess
	}
	for _, rr := range z.withSigs(wild, qtype) {
		rr = dns.Copy(rr)
		rr.Header().Name = name
		answer = append(answer, rr)
	}
	return answer, z.nsec3For(next, true), dns.RcodeSuccess
}

// secResolver is a validating resolver that knows one zone: it answers from
// it, sets AD on validated answers to clients that set AD or DO, fails bogus
// data with SERVFAIL unless the query has CD, and strips the DNSSEC records
// from replies to DO=0 queries, as a real server does.
type secResolver struct{ zone *secZone }

func (s *secResolver) Name() string { return "secresolver" }

func (s *secResolver) ServeDNS(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	return dns.RcodeSuccess, w.WriteMsg(s.answer(r))
}

func (s *secResolver) answer(r *dns.Msg) *dns.Msg {
	z := s.zone
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	o := r.IsEdns0()
	do := o != nil && o.Do()
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	switch {
	case !dns.IsSubDomain(z.origin, name):
		m.Rcode = dns.RcodeRefused
	case z.bogus[name] && !r.CheckingDisabled:
		m.Rcode = dns.RcodeServerFailure // RFC 4035 5.5
	default:
		m.Answer, m.Ns, m.Rcode = z.lookup(name, q.Qtype)
		m.AuthenticatedData = !z.bogus[name] && !r.CheckingDisabled && (r.AuthenticatedData || do)
	}
	if !do {
		m.Answer, m.Ns = secStrip(m.Answer, 0, q.Qtype), secStrip(m.Ns, 1, q.Qtype)
	}
	if o != nil {
		m.SetEdns0(o.UDPSize(), do)
	}
	// Fresh records, as forward hands them over: nothing the cache does can
	// reach the zone.
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	out := new(dns.Msg)
	if err := out.Unpack(b); err != nil {
		panic(err)
	}
	return out
}

// secHidden reports the records of section a DO=0 client must not get: RRSIG,
// NSEC and NSEC3 (RFC 4035 3.2.1) and DS in referrals (3.1.4), but for the
// type it asked for, or any type for ANY (RFC 3225 3), in the answer section.
func secHidden(t uint16, section int, qtype uint16) bool {
	dnssec := t == dns.TypeRRSIG || t == dns.TypeNSEC || t == dns.TypeNSEC3 || t == dns.TypeDS && section != 0
	return dnssec && !(section == 0 && (t == qtype || qtype == dns.TypeANY))
}

// secStrip drops the records of section secHidden hides.
func secStrip(rrs []dns.RR, section int, qtype uint16) []dns.RR {
	var out []dns.RR
	for _, rr := range rrs {
		if !secHidden(rr.Header().Rrtype, section, qtype) {
			out = append(out, rr)
		}
	}
	return out
}

// secSigned reports whether up, the upstream's reply to the cache's query
// for qtype, holds records secHidden hides: an entry stored for a client
// without DO leaves them out, and the first DO client fetches them.
func secSigned(up *dns.Msg, qtype uint16) bool {
	return len(secStrip(up.Answer, 0, qtype))+len(secStrip(up.Ns, 1, qtype))+len(secStrip(up.Extra, 2, qtype)) <
		len(up.Answer)+len(up.Ns)+len(up.Extra)
}

// secQueries is how many upstream queries the clients, in order, cost for a
// question whose reply up is: one, and one more where the first DO client
// comes after one without DO and the reply holds records hidden from it.
func secQueries(up *dns.Msg, qtype uint16, clients []secClient) int {
	if len(clients) == 0 || clients[0].do || !secSigned(up, qtype) || !slices.ContainsFunc(clients, func(cl secClient) bool { return cl.do }) {
		return 1
	}
	return 2
}

// secCounter is the cache's next plugin: it counts the queries that reach the
// upstream and keeps the last one.
type secCounter struct {
	next    plugin.Handler
	mu      sync.Mutex
	queries map[string]int
	last    *dns.Msg
	lastTCP bool
}

func (s *secCounter) Name() string { return "seccounter" }

func (s *secCounter) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	s.mu.Lock()
	if s.queries == nil {
		s.queries = map[string]int{}
	}
	s.queries[qkey(r.Question[0].Name, r.Question[0].Qtype)]++
	s.last = r.Copy()
	_, s.lastTCP = w.RemoteAddr().(*net.TCPAddr)
	s.mu.Unlock()
	return s.next.ServeDNS(ctx, w, r)
}

func (s *secCounter) count(name string, qtype uint16) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[qkey(name, qtype)]
}

func (s *secCounter) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.queries {
		n += c
	}
	return n
}

// secBackend is an upstream holding one signed zone.
type secBackend struct {
	name    string
	zone    *secZone
	handler plugin.Handler
	// direct asks the upstream req itself, past the cache and the counter.
	direct func(t *testing.T, req *dns.Msg) *dns.Msg
	addr   string // where the file backend listens, UDP and TCP
	stop   func() // stops the file backend's server
}

// secFileBackend serves z with the file plugin in an in-process CoreDNS and
// reaches it through forward.
func secFileBackend(t *testing.T, origin string) *secBackend {
	t.Helper()
	z := secZoneFor(t, origin)
	path := filepath.Join(t.TempDir(), "db."+origin)
	if err := os.WriteFile(path, []byte(z.text()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, stop := secStartServer(t, fmt.Sprintf("%s:%%d {\n\tbind 127.0.0.1\n\tfile %s\n}\n", origin, path))
	f := forward.New()
	f.SetProxy(proxy.NewProxy("forward", addr, transport.DNS))
	t.Cleanup(func() { f.OnShutdown() })
	return &secBackend{name: "file+forward/" + origin, zone: z, handler: f, addr: addr, stop: stop, direct: func(t *testing.T, req *dns.Msg) *dns.Msg {
		t.Helper()
		c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
		m, _, err := c.Exchange(req, addr)
		if err != nil {
			t.Fatalf("direct query %s: %v", req.Question[0].String(), err)
		}
		return m
	}}
}

func secResolverBackend(t *testing.T, origin string) *secBackend {
	t.Helper()
	r := &secResolver{zone: secZoneFor(t, origin)}
	return &secBackend{name: "resolver/" + origin, zone: r.zone, handler: r, direct: func(_ *testing.T, req *dns.Msg) *dns.Msg { return r.answer(req) }}
}

// secStartServer starts CoreDNS with corefile, whose %d is the port, on a port
// free for both UDP and TCP (forward uses one address for both), and returns
// its address and a function that stops it (it stops at the test's end too).
func secStartServer(t *testing.T, corefile string) (string, func()) {
	t.Helper()
	var lastErr error
	for range 10 {
		port := testenv.FreePort(t)
		inst, err := startOnce(fmt.Sprintf(corefile, port))
		if err != nil {
			lastErr = err
			continue
		}
		var once sync.Once
		stop := func() { once.Do(func() { stopServers(inst) }) }
		t.Cleanup(stop)
		return fmt.Sprintf("127.0.0.1:%d", port), stop
	}
	t.Fatalf("starting CoreDNS: %v", lastErr)
	return "", nil
}

// secReply is what a client got, and its size on the wire.
type secReply struct {
	*dns.Msg
	size int
}

// secRecorder keeps the reply and its size as the server would send it:
// WriteMsg packs the message as given (the cache sets Compress), Write sends
// the bytes.
type secRecorder struct {
	test.ResponseWriter
	reply  *secReply
	writes int
}

func (r *secRecorder) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	return r.keep(b)
}

func (r *secRecorder) Write(b []byte) (int, error) { return len(b), r.keep(b) }

func (r *secRecorder) keep(b []byte) error {
	r.writes++
	m := new(dns.Msg)
	r.reply = &secReply{Msg: m, size: len(b)}
	return m.Unpack(b)
}

// secAsk sends req through c as a UDP or TCP client and returns its reply.
func secAsk(t *testing.T, c *Cache, req *dns.Msg, tcp bool) *secReply {
	t.Helper()
	rec := &secRecorder{ResponseWriter: test.ResponseWriter{TCP: tcp}}
	if _, err := c.ServeDNS(context.Background(), rec, req); err != nil {
		t.Fatalf("ServeDNS(%s): %v", req.Question[0].String(), err)
	}
	if rec.writes != 1 {
		t.Fatalf("ServeDNS(%s) wrote %d replies, want 1", req.Question[0].String(), rec.writes)
	}
	return rec.reply
}

// secClient is how a client asks: its header bits and EDNS.
type secClient struct {
	do, ad, cd bool
	edns       bool   // the request has OPT (always with DO)
	size       uint16 // its UDP size, 4096 when 0
	tcp        bool
}

func (cl secClient) String() string {
	s := fmt.Sprintf("DO=%d AD=%d CD=%d", secBit(cl.do), secBit(cl.ad), secBit(cl.cd))
	if !cl.edns && !cl.do {
		s += " no-EDNS"
	}
	if cl.tcp {
		s += " TCP"
	}
	return s
}

func secBit(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (cl secClient) msg(qname string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(qname, qtype)
	m.AuthenticatedData = cl.ad
	m.CheckingDisabled = cl.cd
	if cl.edns || cl.do {
		size := cl.size
		if size == 0 {
			size = 4096
		}
		m.SetEdns0(size, cl.do)
	}
	return m
}

// upstreamQuery is the query the cache's miss path sends for req, as issue 5
// has it: DO=1, AD=1, a large EDNS buffer, the client's CD and RD.
func secUpstreamQuery(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(req.Question[0].Name, req.Question[0].Qtype)
	m.RecursionDesired = req.RecursionDesired
	m.CheckingDisabled = req.CheckingDisabled
	m.AuthenticatedData = true
	m.SetEdns0(4096, true)
	return m
}

// secCase is one question and what the zone answers it with.
type secCase struct {
	qname string
	qtype uint16
	rcode int
	// proofs the DO=1 reply's authority section must carry: "match:<name>"
	// (an NSEC owned by, or an NSEC3 matching, the name) or "cover:<name>".
	proofs []string
}

func (c secCase) String() string { return c.qname + "/" + dns.TypeToString[c.qtype] }

func secCases(z *secZone) []secCase {
	o := z.origin
	cases := []secCase{
		{qname: "www." + o, qtype: dns.TypeA},
		{qname: "WwW." + strings.ToUpper(o), qtype: dns.TypeAAAA}, // 0x20: signatures verify over the echoed case
		{qname: "alias." + o, qtype: dns.TypeA},                   // signed CNAME and target
		{qname: o, qtype: dns.TypeMX},                             // signed additional records
		{qname: o, qtype: dns.TypeDNSKEY},
		{qname: "www." + o, qtype: dns.TypeRRSIG},
		{qname: "child." + o, qtype: dns.TypeDS},
		{qname: "nope." + o, qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{qname: "www." + o, qtype: dns.TypeMX},       // NODATA
		{qname: "host.wild." + o, qtype: dns.TypeA},  // wildcard answer
		{qname: "host.wild." + o, qtype: dns.TypeMX}, // wildcard NODATA
	}
	if !z.nsec3 {
		cases = append(cases,
			secCase{qname: "www." + o, qtype: dns.TypeNSEC},
			secCase{qname: "host.child." + o, qtype: dns.TypeA}, // referral with a signed DS
		)
		for i := range cases {
			switch c := &cases[i]; c.qname {
			case "nope." + o:
				c.proofs = []string{"cover:nope." + o, "cover:*." + o}
			case "www." + o:
				if c.qtype == dns.TypeMX {
					c.proofs = []string{"match:www." + o}
				}
			case "host.wild." + o:
				c.proofs = []string{"cover:host.wild." + o}
				if c.qtype == dns.TypeMX {
					c.proofs = []string{"match:*.wild." + o}
				}
			}
		}
		return cases
	}
	hashed := strings.ToLower(dns.HashName("www."+o, dns.SHA1, 0, "")) + "." + o
	cases = append(cases,
		secCase{qname: hashed, qtype: dns.TypeNSEC3},
		secCase{qname: "wild." + o, qtype: dns.TypeA}, // empty non-terminal: NODATA
	)
	for i := range cases {
		switch c := &cases[i]; c.qname {
		case "nope." + o:
			c.proofs = []string{"match:" + o, "cover:nope." + o, "cover:*." + o}
		case "www." + o:
			if c.qtype == dns.TypeMX {
				c.proofs = []string{"match:www." + o}
			}
		case "wild." + o:
			c.proofs = []string{"match:wild." + o}
		case "host.wild." + o:
			c.proofs = []string{"cover:host.wild." + o}
			if c.qtype == dns.TypeMX {
				c.proofs = []string{"match:wild." + o, "cover:host.wild." + o, "match:*.wild." + o}
			}
		}
	}
	return cases
}

// secWant is what a client asking req should get when the upstream answers
// the cache's query with up: up itself for DO=1, and for DO=0 up without the
// records secHidden hides.
func secWant(up, req *dns.Msg) *dns.Msg {
	w := up.Copy()
	w.RecursionDesired = req.RecursionDesired
	if o := req.IsEdns0(); o == nil || !o.Do() {
		qt := req.Question[0].Qtype
		w.Answer, w.Ns, w.Extra = secStrip(w.Answer, 0, qt), secStrip(w.Ns, 1, qt), secStrip(w.Extra, 2, qt)
	}
	return w
}

// secCheck checks got, the reply to req, against up, the upstream's reply to
// the cache's own query.
func secCheck(t *testing.T, tag string, z *secZone, tc secCase, cl secClient, req *dns.Msg, got *secReply, up *dns.Msg) {
	t.Helper()
	do := cl.do
	qt := req.Question[0].Qtype
	if got.Rcode != tc.rcode {
		t.Errorf("%s: rcode %s, want %s", tag, dns.RcodeToString[got.Rcode], dns.RcodeToString[tc.rcode])
	}
	if got.Id != req.Id || len(got.Question) != 1 || got.Question[0] != req.Question[0] {
		t.Errorf("%s: reply ID %d question %v, want %d %v", tag, got.Id, got.Question, req.Id, req.Question[0])
	}
	want := secWant(up, req)
	limit := dns.MaxMsgSize
	if !cl.tcp {
		limit = dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			limit = max(limit, int(o.UDPSize()))
		}
	}
	want.Compress = true
	if got.size > limit {
		t.Errorf("%s: reply of %d bytes, over the client's %d", tag, got.size, limit)
	}
	if b, _ := want.Pack(); len(b) <= limit-32 { // the cache compresses a little less than miekg/dns
		if err := sameReply(got.Msg, want); err != nil {
			t.Errorf("%s: %v", tag, err)
		}
	}

	// EDNS: OPT only for EDNS clients, DO echoed (RFC 3225 3).
	checkOPT(t, tag, got.Msg, req)
	// AD only for clients that set AD or DO (RFC 6840 5.7-5.8), and only
	// when the upstream vouched for the data.
	if wantAD := up.AuthenticatedData && (cl.ad || cl.do); got.AuthenticatedData != wantAD {
		t.Errorf("%s: AD=%v, want %v (upstream AD=%v)", tag, got.AuthenticatedData, wantAD, up.AuthenticatedData)
	}
	if got.CheckingDisabled != req.CheckingDisabled {
		t.Errorf("%s: CD=%v, request CD=%v", tag, got.CheckingDisabled, req.CheckingDisabled)
	}

	if !do {
		// RFC 4035 3.2.1: no RRSIG, NSEC or NSEC3 the client did not ask for.
		for s, rrs := range [][]dns.RR{got.Answer, got.Ns, got.Extra} {
			for _, rr := range rrs {
				if secHidden(rr.Header().Rrtype, s, qt) {
					t.Errorf("%s: DO=0 client got, in section %d: %s", tag, s, rr)
				}
			}
		}
		return
	}
	if got.Truncated {
		return
	}
	secVerify(t, tag, z, got.Msg, qt)
	for _, p := range tc.proofs {
		kind, name, _ := strings.Cut(p, ":")
		if !secProves(z, got.Ns, kind, name, qt) {
			t.Errorf("%s: authority section proves no %s of %s:\n%v", tag, kind, name, got.Ns)
		}
	}
}

// secVerify checks every RRSIG in m against the zone's keys and the RRset it
// covers in the same section.
func secVerify(t *testing.T, tag string, z *secZone, m *dns.Msg, qtype uint16) {
	t.Helper()
	now := time.Now()
	for s, rrs := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range rrs {
			sig, ok := rr.(*dns.RRSIG)
			if !ok {
				continue
			}
			var set []dns.RR
			for _, r := range rrs {
				if r.Header().Rrtype == sig.TypeCovered && strings.EqualFold(r.Header().Name, sig.Hdr.Name) {
					set = append(set, r)
				}
			}
			if len(set) == 0 {
				if qtype != dns.TypeRRSIG {
					t.Errorf("%s: section %d: %s without the RRset it covers", tag, s, sig)
				}
				continue
			}
			var err error = dns.ErrKey
			for _, k := range z.keys {
				if k.KeyTag() == sig.KeyTag && k.Algorithm == sig.Algorithm {
					if err = sig.Verify(k, set); err == nil {
						break
					}
				}
			}
			if err != nil {
				t.Errorf("%s: section %d: %s does not verify: %v", tag, s, sig, err)
			}
			if !sig.ValidityPeriod(now) {
				t.Errorf("%s: %s outside its validity period", tag, sig)
			}
		}
	}
}

// secProves reports whether rrs hold an NSEC or NSEC3 record that matches
// name (and, for NSEC, lacks qtype) or covers it.
func secProves(z *secZone, rrs []dns.RR, kind, name string, qtype uint16) bool {
	for _, rr := range rrs {
		switch x := rr.(type) {
		case *dns.NSEC3:
			if kind == "match" && x.Match(name) || kind == "cover" && x.Cover(name) {
				return true
			}
		case *dns.NSEC:
			owner, next := strings.ToLower(x.Hdr.Name), strings.ToLower(x.NextDomain)
			switch kind {
			case "match":
				if owner == strings.ToLower(name) && !slices.Contains(x.TypeBitMap, qtype) {
					return true
				}
			case "cover":
				after := secCanonLess(owner, name)
				before := secCanonLess(name, next) || next == z.origin // the last NSEC points back at the apex
				if after && before {
					return true
				}
			}
		}
	}
	return false
}

func secBackends(t *testing.T) []*secBackend {
	return []*secBackend{
		secFileBackend(t, "ecdsa.example."),
		secFileBackend(t, "rsa.example."),
		secResolverBackend(t, "nsec3.example."),
	}
}

// secNewCache returns a cache in front of b's upstream, counting its queries.
func secNewCache(b *secBackend, raw bool) (*Cache, *secCounter) {
	cnt := &secCounter{next: b.handler}
	c := New()
	c.Next = cnt
	c.SetRawWrites(raw)
	return c, cnt
}

// TestDNSSECOneEntryForDOAndNonDO asks every question of each signed zone from
// DO and non-DO clients, in three orders, on both reply paths: one entry per
// question in all, one upstream query when a DO client asks first, and one
// more (the upgrade) when a client without DO filled the entry with a reply
// that has DNSSEC records; DO=1 clients get the records as the upstream sent
// them with valid signatures and denial proofs, DO=0 clients get them
// without RRSIG/NSEC/NSEC3 unless asked for, OPT echoes DO.
func TestDNSSECOneEntryForDOAndNonDO(t *testing.T) {
	var (
		do     = secClient{do: true}
		plain  = secClient{edns: true}
		noEDNS = secClient{}
		doAD   = secClient{do: true, ad: true}
		adOnly = secClient{edns: true, ad: true}
		doTCP  = secClient{do: true, tcp: true}
	)
	orders := map[string][]secClient{
		"DO first":      {do, plain, noEDNS, adOnly, doTCP},
		"non-DO first":  {plain, do, noEDNS, doAD, adOnly},
		"no-EDNS first": {noEDNS, doTCP, plain, do},
	}
	for _, b := range secBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			cases := secCases(b.zone)
			ups := map[string]*dns.Msg{}
			for _, tc := range cases {
				up := b.direct(t, secUpstreamQuery(secClient{}.msg(tc.qname, tc.qtype)))
				if up.Rcode != tc.rcode || up.Truncated {
					t.Fatalf("%s: upstream answers %s TC=%v, want %s: the zone is wrong", tc, dns.RcodeToString[up.Rcode], up.Truncated, dns.RcodeToString[tc.rcode])
				}
				ups[tc.String()] = up
			}
			for order, clients := range orders {
				for _, raw := range []bool{false, true} {
					c, cnt := secNewCache(b, raw)
					for _, tc := range cases {
						for i, cl := range clients {
							req := cl.msg(tc.qname, tc.qtype)
							got := secAsk(t, c, req, cl.tcp)
							tag := fmt.Sprintf("%s raw=%v %s query %d (%s)", order, raw, tc, i, cl)
							secCheck(t, tag, b.zone, tc, cl, req, got, ups[tc.String()])
						}
						if n, want := cnt.count(tc.qname, tc.qtype), secQueries(ups[tc.String()], tc.qtype, clients); n != want {
							t.Errorf("%s raw=%v %s: upstream asked %d times for %d clients, want %d", order, raw, tc, n, len(clients), want)
						}
					}
					if n := c.Stats().Entries; n != int64(len(cases)) {
						t.Errorf("%s raw=%v: %d entries for %d questions, want one each", order, raw, n, len(cases))
					}
				}
			}
		})
	}
}

// TestDNSSECQtypes: a DO=0 client that asks for RRSIG, NSEC, NSEC3, DNSKEY or
// DS gets the records of that type (RFC 4035 3.2.1), and no other DNSSEC
// record.
func TestDNSSECQtypes(t *testing.T) {
	for _, b := range secBackends(t) {
		o := b.zone.origin
		qs := []secCase{{qname: "www." + o, qtype: dns.TypeRRSIG}, {qname: o, qtype: dns.TypeDNSKEY}, {qname: "child." + o, qtype: dns.TypeDS}}
		if b.zone.nsec3 {
			qs = append(qs, secCase{qname: strings.ToLower(dns.HashName("www."+o, dns.SHA1, 0, "")) + "." + o, qtype: dns.TypeNSEC3})
		} else {
			qs = append(qs, secCase{qname: "www." + o, qtype: dns.TypeNSEC})
		}
		for _, raw := range []bool{false, true} {
			c, _ := secNewCache(b, raw)
			for _, q := range qs {
				for _, cl := range []secClient{{edns: true}, {do: true}, {edns: true}} {
					got := secAsk(t, c, cl.msg(q.qname, q.qtype), false)
					n := 0
					for _, rr := range got.Answer {
						if rr.Header().Rrtype == q.qtype {
							n++
						}
						if rr.Header().Rrtype == dns.TypeRRSIG && q.qtype != dns.TypeRRSIG && !cl.do {
							t.Errorf("%s raw=%v %s (%s): %s", b.name, raw, q, cl, rr)
						}
					}
					if n == 0 {
						t.Errorf("%s raw=%v %s (%s): no %s record in the answer:\n%v", b.name, raw, q, cl, dns.TypeToString[q.qtype], got)
					}
					if q.qtype == dns.TypeRRSIG {
						// All signatures at www: A, AAAA and the NSEC or NSEC3 chain's.
						covered := map[uint16]bool{}
						for _, rr := range got.Answer {
							if s, ok := rr.(*dns.RRSIG); ok {
								covered[s.TypeCovered] = true
							}
						}
						if !covered[dns.TypeA] || !covered[dns.TypeAAAA] {
							t.Errorf("%s raw=%v %s (%s): signatures cover %v", b.name, raw, q, cl, covered)
						}
					}
				}
			}
		}
	}
}

// TestDNSSECCheckingDisabled: CD is in the key. A reply fetched with CD=1 (data
// the upstream did not validate, or found bogus) is never served to a CD=0
// client, and the CD=0 client's own query reaches the upstream.
func TestDNSSECCheckingDisabled(t *testing.T) {
	res := secResolverBackend(t, "nsec3.example.")
	file := secFileBackend(t, "ecdsa.example.")
	for _, raw := range []bool{false, true} {
		// Bogus data: the validating upstream fails it unless CD=1.
		c, cnt := secNewCache(res, raw)
		bogus := "bogus.nsec3.example."
		got := secAsk(t, c, secClient{do: true, cd: true}.msg(bogus, dns.TypeA), false)
		if got.Rcode != dns.RcodeSuccess || len(got.Answer) != 2 || got.AuthenticatedData || !got.CheckingDisabled {
			t.Errorf("raw=%v CD=1 DO=1 for bogus data: %v", raw, got)
		}
		for i, cl := range []secClient{{do: true}, {edns: true}, {}} {
			got := secAsk(t, c, cl.msg(bogus, dns.TypeA), false)
			if got.Rcode != dns.RcodeServerFailure || len(got.Answer) != 0 {
				t.Errorf("raw=%v CD=0 query %d (%s) after a CD=1 one got the CD=1 reply: %v", raw, i, cl, got)
			}
		}
		if n := cnt.count(bogus, dns.TypeA); n != 2 {
			t.Errorf("raw=%v: upstream asked %d times for CD=1 then CD=0 queries, want 2", raw, n)
		}
		got = secAsk(t, c, secClient{edns: true, cd: true}.msg(bogus, dns.TypeA), false)
		if got.Rcode != dns.RcodeSuccess || len(got.Answer) != 1 || got.Answer[0].Header().Rrtype != dns.TypeA {
			t.Errorf("raw=%v CD=1 DO=0 for bogus data, from the cache: %v", raw, got)
		}
		if n := cnt.count(bogus, dns.TypeA); n != 2 {
			t.Errorf("raw=%v: upstream asked %d times, want 2: both entries cached", raw, n)
		}

		// Valid data: the CD=1 reply has no AD; the CD=0 DO=1 client gets
		// AD, so its reply did not come from the CD=1 entry.
		www := "www.nsec3.example."
		up := res.direct(t, secUpstreamQuery(secClient{}.msg(www, dns.TypeA)))
		cdUp := res.direct(t, secUpstreamQuery(secClient{cd: true}.msg(www, dns.TypeA)))
		for i, cl := range []secClient{{do: true, cd: true}, {do: true}, {edns: true, cd: true}, {edns: true}} {
			req := cl.msg(www, dns.TypeA)
			want := up
			if cl.cd {
				want = cdUp
			}
			secCheck(t, fmt.Sprintf("raw=%v www query %d (%s)", raw, i, cl), res.zone, secCase{qname: www, qtype: dns.TypeA}, cl, req, secAsk(t, c, req, false), want)
		}
		if n := cnt.count(www, dns.TypeA); n != 2 {
			t.Errorf("raw=%v: upstream asked %d times for CD=1 and CD=0 clients, want 2", raw, n)
		}

		// The same through forward to the file plugin.
		c, cnt = secNewCache(file, raw)
		www = "www.ecdsa.example."
		tc := secCase{qname: www, qtype: dns.TypeA}
		for i, cl := range []secClient{{do: true, cd: true}, {edns: true, cd: true}, {do: true}, {edns: true}, {do: true, cd: true}} {
			req := cl.msg(www, dns.TypeA)
			secCheck(t, fmt.Sprintf("file raw=%v query %d (%s)", raw, i, cl), file.zone, tc, cl, req, secAsk(t, c, req, false), file.direct(t, secUpstreamQuery(req)))
		}
		if n := cnt.count(www, dns.TypeA); n != 2 {
			t.Errorf("file raw=%v: upstream asked %d times for CD=1 and CD=0 clients, want 2", raw, n)
		}
	}
}

// TestDNSSECADBit: the upstream validated the data and set AD; the client gets
// AD only when it set AD or DO (RFC 6840 5.7-5.8), whichever client filled
// the entry or upgraded it, on the miss and the hit path.
func TestDNSSECADBit(t *testing.T) {
	res := secResolverBackend(t, "nsec3.example.")
	clients := []secClient{{}, {edns: true}, {ad: true}, {edns: true, ad: true}, {do: true}, {do: true, ad: true}}
	for _, q := range []secCase{
		{qname: "www.nsec3.example.", qtype: dns.TypeA},
		{qname: "nope.nsec3.example.", qtype: dns.TypeA, rcode: dns.RcodeNameError},
		{qname: "www.nsec3.example.", qtype: dns.TypeMX},
	} {
		up := res.direct(t, secUpstreamQuery(secClient{}.msg(q.qname, q.qtype)))
		if !up.AuthenticatedData {
			t.Fatalf("%s: the upstream did not set AD", q)
		}
		for _, raw := range []bool{false, true} {
			for _, first := range clients {
				c, cnt := secNewCache(res, raw)
				for i, cl := range append([]secClient{first}, clients...) {
					got := secAsk(t, c, cl.msg(q.qname, q.qtype), false)
					if want := cl.ad || cl.do; got.AuthenticatedData != want {
						t.Errorf("%s raw=%v first %s, query %d (%s): AD=%v, want %v", q, raw, first, i, cl, got.AuthenticatedData, want)
					}
				}
				if n, want := cnt.count(q.qname, q.qtype), secQueries(up, q.qtype, append([]secClient{first}, clients...)); n != want {
					t.Errorf("%s raw=%v first %s: upstream asked %d times, want %d", q, raw, first, n, want)
				}
			}
		}
	}
}

// TestDNSSECUncachedReplyFiltered: a reply the cache does not store (a signed
// CNAME to a name outside the zone, without SOA: RFC 2308 5) still reaches a
// DO=0 client without its RRSIG, AD per RFC 6840 and DO echoed as the client
// set it; a DO=1 client gets the signature.
func TestDNSSECUncachedReplyFiltered(t *testing.T) {
	res := secResolverBackend(t, "nsec3.example.")
	name := "partial.nsec3.example."
	tc := secCase{qname: name, qtype: dns.TypeA}
	up := res.direct(t, secUpstreamQuery(secClient{}.msg(name, dns.TypeA)))
	for _, raw := range []bool{false, true} {
		c, cnt := secNewCache(res, raw)
		clients := []secClient{{edns: true}, {do: true}, {}, {edns: true, ad: true}, {do: true, tcp: true}}
		for i, cl := range clients {
			req := cl.msg(name, dns.TypeA)
			got := secAsk(t, c, req, cl.tcp)
			secCheck(t, fmt.Sprintf("raw=%v query %d (%s)", raw, i, cl), res.zone, tc, cl, req, got, up)
			if len(got.Answer) == 0 || got.Answer[0].Header().Rrtype != dns.TypeCNAME {
				t.Errorf("raw=%v query %d (%s): answer %v, want the CNAME", raw, i, cl, got.Answer)
			}
		}
		if n := cnt.count(name, dns.TypeA); n != len(clients) {
			t.Errorf("raw=%v: upstream asked %d times for %d clients, want every time (not cached)", raw, n, len(clients))
		}
		if n := c.Stats().Entries; n != 0 {
			t.Errorf("raw=%v: %d entries, want 0", raw, n)
		}
	}
}

// TestDNSSECUpstreamQuery: whatever the client sent, the cache's upstream
// query has DO=1, AD=1 and an EDNS buffer of at least 1232 bytes, keeps the
// client's CD, and the client's request is left as it was.
func TestDNSSECUpstreamQuery(t *testing.T) {
	res := secResolverBackend(t, "nsec3.example.")
	for i, cl := range []secClient{{}, {edns: true, size: 512}, {do: true, size: 1232}, {do: true, cd: true, size: 4096}, {cd: true}} {
		c, cnt := secNewCache(res, false)
		req := cl.msg("www.nsec3.example.", dns.TypeA)
		before := req.Copy()
		secAsk(t, c, req, false)
		up := cnt.last
		o := up.IsEdns0()
		if o == nil || !o.Do() || o.UDPSize() < 1232 || !up.AuthenticatedData || up.CheckingDisabled != cl.cd {
			t.Errorf("client %d (%s): upstream query AD=%v CD=%v OPT %v; want DO, AD, a buffer of 1232 or more and CD=%v",
				i, cl, up.AuthenticatedData, up.CheckingDisabled, o, cl.cd)
		}
		if req.String() != before.String() {
			t.Errorf("client %d (%s): the client's request changed:\n%v\nwas\n%v", i, cl, req, before)
		}
	}
}

// TestDNSSECLargeSignedAnswer: a signed RRset larger than the cache's 1232-byte
// upstream queries comes back truncated over UDP; the cache retries over TCP,
// stores the reply without its signatures for the client without DO, and
// the first DO=1 client's upgrade, with a 1232-byte buffer over UDP too, is
// retried over TCP and
// stored whole: later clients get it whole, DO=1 ones with valid
// signatures, without another upstream query.
func TestDNSSECLargeSignedAnswer(t *testing.T) {
	for _, origin := range []string{"ecdsa.example.", "rsa.example."} {
		b := secFileBackend(t, origin)
		name := "big." + origin
		tc := secCase{qname: name, qtype: dns.TypeTXT}
		up := b.direct(t, secUpstreamQuery(secClient{}.msg(name, dns.TypeTXT)))
		if b, _ := up.Pack(); len(b) <= upstreamUDPSize {
			t.Fatalf("%s: signed answer of %d bytes fits the cache's UDP queries; make it bigger", name, len(b))
		}
		for _, raw := range []bool{false, true} {
			c, cnt := secNewCache(b, raw)
			// A UDP client without EDNS: the cache asks with a 1232-byte
			// buffer; the client itself gets a truncated reply.
			cl := secClient{}
			req := cl.msg(name, dns.TypeTXT)
			got := secAsk(t, c, req, false)
			secCheck(t, fmt.Sprintf("%s raw=%v first query (%s)", origin, raw, cl), b.zone, tc, cl, req, got, up)
			if !got.Truncated {
				t.Errorf("%s raw=%v: no TC on a reply too large for a 512-byte client", origin, raw)
			}
			if n := c.Stats().Entries; n != 1 {
				t.Errorf("%s raw=%v: %d entries after the first query, want 1: the truncated UDP reply was not retried over TCP and stored", origin, raw, n)
			}
			if !cnt.lastTCP {
				t.Errorf("%s raw=%v: the cache's last upstream query went over UDP, want a TCP retry", origin, raw)
			}
			cl = secClient{do: true, size: 1232}
			req = cl.msg(name, dns.TypeTXT)
			secCheck(t, fmt.Sprintf("%s raw=%v upgrade (%s)", origin, raw, cl), b.zone, tc, cl, req, secAsk(t, c, req, false), up)
			if !cnt.lastTCP {
				t.Errorf("%s raw=%v: the upgrade's last upstream query went over UDP, want a TCP retry", origin, raw)
			}
			asked := cnt.total()
			for i, cl := range []secClient{{do: true, tcp: true}, {do: true}, {edns: true}, {tcp: true}} {
				req := cl.msg(name, dns.TypeTXT)
				got := secAsk(t, c, req, cl.tcp)
				secCheck(t, fmt.Sprintf("%s raw=%v query %d (%s)", origin, raw, i+1, cl), b.zone, tc, cl, req, got, up)
				if got.Truncated || len(got.Answer) == 0 {
					t.Errorf("%s raw=%v query %d (%s): TC=%v, %d answers", origin, raw, i+1, cl, got.Truncated, len(got.Answer))
				}
			}
			if n := cnt.total(); n != asked {
				t.Errorf("%s raw=%v: upstream asked %d more times after the upgrade, want 0", origin, raw, n-asked)
			}
		}
	}
}

// TestDNSSECZoneSigned checks the test's own zones, so that a failure above is
// the cache's: every RRSIG verifies and each chain links every name.
func TestDNSSECZoneSigned(t *testing.T) {
	for _, sp := range secSpecs {
		z := secZoneFor(t, sp.origin)
		var sigs, chain int
		for _, rr := range z.rrs {
			switch rr.Header().Rrtype {
			case dns.TypeRRSIG:
				sigs++
			case dns.TypeNSEC, dns.TypeNSEC3:
				chain++
			}
		}
		if sigs == 0 || chain == 0 {
			t.Fatalf("%s: %d signatures, %d chain records", sp.origin, sigs, chain)
		}
		// Verify all but the bogus ones.
		for _, rr := range z.rrs {
			sig, ok := rr.(*dns.RRSIG)
			if !ok || z.bogus[strings.ToLower(sig.Hdr.Name)] {
				continue
			}
			set := z.sets[strings.ToLower(sig.Hdr.Name)][sig.TypeCovered]
			ok = false
			for _, k := range z.keys {
				if k.KeyTag() == sig.KeyTag && sig.Verify(k, set) == nil {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s: %s does not verify", sp.origin, sig)
			}
		}
	}
}

// TestDNSSECThroughCoreDNS runs the cache as users do: compactcache and forward
// in a CoreDNS server block (hits go out as raw bytes: nothing in the block
// needs WriteMsg), in front of the file plugin serving the signed zone from
// another CoreDNS. The first client fills the cache for every question, and
// a DO client after one without DO upgrades the entry (through the server
// core: the front end hands the DO query for an entry without its DNSSEC
// records to the chain); then the upstream stops, so every later reply, to
// DO and non-DO clients over UDP and TCP, comes from the one entry stored
// per question: through the server core, or from the front end.
func TestDNSSECThroughCoreDNS(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) { testDNSSECThroughCoreDNS(t, mode) })
	}
}

func testDNSSECThroughCoreDNS(t *testing.T, mode cacheMode) {
	for _, origin := range []string{"ecdsa.example.", "rsa.example."} {
		for _, first := range []secClient{{do: true}, {edns: true}, {}} {
			b := secFileBackend(t, origin)
			udp, tcp := mode.start(t, b.addr)
			cases := append(secCases(b.zone), secCase{qname: "big." + origin, qtype: dns.TypeTXT})
			ups := map[string]*dns.Msg{}
			for _, tc := range cases {
				ups[tc.String()] = b.direct(t, secUpstreamQuery(secClient{}.msg(tc.qname, tc.qtype)))
			}
			ask := func(i int, cl secClient, tc secCase) {
				t.Helper()
				req := cl.msg(tc.qname, tc.qtype)
				var got *secReply
				if cl.tcp {
					got = &secReply{Msg: exchangeTCP(t, tcp, req)}
				} else {
					r, n := exchangeUDP(t, udp, req)
					got = &secReply{Msg: r, size: n}
				}
				tag := fmt.Sprintf("%s first %s: %s query %d (%s)", origin, first, tc, i, cl)
				secCheck(t, tag, b.zone, tc, cl, req, got, ups[tc.String()])
			}
			for _, tc := range cases {
				ask(0, first, tc)
				if !first.do {
					ask(0, secClient{do: true}, tc)
				}
			}
			b.stop()
			for _, tc := range cases {
				for i, cl := range []secClient{{do: true}, {edns: true}, {}, {do: true, tcp: true}, {tcp: true}, {do: true, ad: true}, {edns: true, size: 1232}} {
					ask(i+1, cl, tc)
				}
			}
		}
	}
}

// TestDNSSECSignatureExpiresFirst: a signature that expires before its
// RRset's TTL runs out is served to DO clients only until it expires (RFC
// 4035 5.3.3, as a validator caps it), with a TTL no longer than what is
// left of it; after that a DO client misses and fetches the zone's new
// one, while clients without DO still hit.
func TestDNSSECSignatureExpiresFirst(t *testing.T) {
	clk := newClock()
	now := uint32(clk.now().Unix())
	u := newUpstream()
	sig := func(expires uint32) dns.RR {
		return test.RRSIG(fmt.Sprintf("s.example.org. 3600 IN RRSIG A 8 3 3600 %s %s 12345 example.org. AAAA",
			dns.TimeToString(expires), dns.TimeToString(now-3600)))
	}
	signed := func(expires uint32) func(r *dns.Msg) *dns.Msg {
		return func(r *dns.Msg) *dns.Msg {
			m := new(dns.Msg)
			m.SetReply(r)
			m.Answer = []dns.RR{test.A("s.example.org. 3600 IN A 192.0.2.1"), sig(expires)}
			m.SetEdns0(1232, true)
			return m
		}
	}
	u.set("s.example.org.", dns.TypeA, signed(now+100))
	c := newTestCache(t, u, clk)
	ask := func(do bool) *dns.Msg {
		return ask(t, c, test.Case{Qname: "s.example.org.", Qtype: dns.TypeA, Do: do}.Msg(), false)
	}
	sigTTL := func(m *dns.Msg) int {
		for _, rr := range m.Answer {
			if rr.Header().Rrtype == dns.TypeRRSIG {
				return int(rr.Header().Ttl)
			}
		}
		return -1
	}
	for i := range 2 {
		if m := ask(true); sigTTL(m) < 0 || sigTTL(m) > 100 {
			t.Errorf("DO query %d: RRSIG TTL %d, want at most the 100 s left of it", i, sigTTL(m))
		}
	}
	if n := u.count("s.example.org.", dns.TypeA); n != 1 {
		t.Fatalf("upstream asked %d times for a miss and a hit, want 1", n)
	}
	u.set("s.example.org.", dns.TypeA, signed(now+86400))
	clk.advance(101 * time.Second)
	if m := ask(false); len(m.Answer) != 1 {
		t.Errorf("query without DO: answer %v, want the A record", m.Answer)
	}
	if n := u.count("s.example.org.", dns.TypeA); n != 1 {
		t.Errorf("a client without DO fetched again (%d queries): its records have 3499 s left", n)
	}
	if m := ask(true); sigTTL(m) < 3000 {
		t.Errorf("DO query past the signature's expiration: RRSIG TTL %d, want the new signature's", sigTTL(m))
	}
	if n := u.count("s.example.org.", dns.TypeA); n != 2 {
		t.Errorf("upstream asked %d times, want 2: a DO client past the signature's expiration fetches it again", n)
	}
}

// TestDNSSECAskedSignatureExpires: signatures a client asked for, by type
// RRSIG or ANY, are served no longer than they are valid either (RFC 4035
// 5.3.3): with a TTL no longer than what is left of them, and past their
// expiration the next client fetches the zone's new ones.
func TestDNSSECAskedSignatureExpires(t *testing.T) {
	for _, qtype := range []uint16{dns.TypeRRSIG, dns.TypeANY} {
		clk := newClock()
		now := uint32(clk.now().Unix())
		u := newUpstream()
		signed := func(expires uint32) func(r *dns.Msg) *dns.Msg {
			return func(r *dns.Msg) *dns.Msg {
				m := new(dns.Msg)
				m.SetReply(r)
				m.Answer = []dns.RR{test.RRSIG(fmt.Sprintf("s.example.org. 3600 IN RRSIG A 8 3 3600 %s %s 12345 example.org. AAAA",
					dns.TimeToString(expires), dns.TimeToString(now-3600)))}
				if qtype == dns.TypeANY {
					m.Answer = append([]dns.RR{test.A("s.example.org. 3600 IN A 192.0.2.1")}, m.Answer...)
				}
				m.SetEdns0(1232, true)
				return m
			}
		}
		u.set("s.example.org.", qtype, signed(now+100))
		c := newTestCache(t, u, clk)
		for _, do := range []bool{true, false} {
			m := ask(t, c, test.Case{Qname: "s.example.org.", Qtype: qtype, Do: do}.Msg(), false)
			for _, rr := range m.Answer {
				if rr.Header().Rrtype == dns.TypeRRSIG && rr.Header().Ttl > 100 {
					t.Errorf("%s DO=%v: RRSIG TTL %d, want at most the 100 s left of it", dns.TypeToString[qtype], do, rr.Header().Ttl)
				}
			}
		}
		u.set("s.example.org.", qtype, signed(now+86400))
		clk.advance(101 * time.Second)
		ask(t, c, test.Case{Qname: "s.example.org.", Qtype: qtype}.Msg(), false)
		if n := u.count("s.example.org.", qtype); n != 2 {
			t.Errorf("%s: upstream asked %d times, want 2: past the signature's expiration it is fetched again", dns.TypeToString[qtype], n)
		}
	}
}
