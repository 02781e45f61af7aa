package tier

import (
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/miekg/dns"
)

// TestBreaker: the breaker opens after breakerFailures failures in a row,
// skips requests for its back-off, lets one probe through, doubles the
// back-off up to breakerMaxBackoff on a failed probe, closes on a
// successful one, and says so once per change.
func TestBreaker(t *testing.T) {
	var changes []string
	b := breaker{changed: func(from, to breakerState, err error) { changes = append(changes, from.String()+">"+to.String()) }}
	now := time.Unix(1000, 0)
	fail := errors.New("down")

	// A success in between starts the count again.
	for range breakerFailures - 1 {
		b.failure(now, fail)
	}
	b.success()
	for range breakerFailures - 1 {
		b.failure(now, fail)
	}
	if !b.allow(now) || b.current() != closed {
		t.Fatalf("opened after %d failures that a success split", 2*(breakerFailures-1))
	}
	b.failure(now, fail)
	if b.current() != open || b.allow(now) || b.allow(now.Add(breakerMinBackoff-time.Millisecond)) {
		t.Fatalf("after %d failures in a row: %v, want open and skipping", breakerFailures, b.current())
	}
	// A request begun before it opened does not lengthen the back-off.
	b.failure(now, fail)
	want := breakerMinBackoff
	for round := 0; want < breakerMaxBackoff || round < 3; round++ {
		probe := now.Add(b.backoff)
		if b.backoff != want {
			t.Fatalf("round %d: back-off %v, want %v", round, b.backoff, want)
		}
		if !b.allow(probe) || b.current() != halfOpen {
			t.Fatalf("round %d: no probe after the back-off", round)
		}
		if b.allow(probe) {
			t.Fatalf("round %d: a second request while the probe is out", round)
		}
		b.failure(probe, fail)
		now, want = probe, min(2*want, breakerMaxBackoff)
	}
	if b.backoff != breakerMaxBackoff {
		t.Fatalf("back-off %v after many failed probes, want the cap %v", b.backoff, breakerMaxBackoff)
	}
	b.allow(now.Add(b.backoff))
	b.success()
	if b.current() != closed || !b.allow(now) || b.backoff != 0 {
		t.Fatalf("after a successful probe: %v, back-off %v", b.current(), b.backoff)
	}
	// The next opening starts from the shortest back-off again.
	for range breakerFailures {
		b.failure(now, fail)
	}
	if b.backoff != breakerMinBackoff {
		t.Errorf("back-off %v after closing and opening again, want %v", b.backoff, breakerMinBackoff)
	}
	// One report per change: each from the state the last one left.
	for i, c := range changes {
		from, to, _ := strings.Cut(c, ">")
		if from == to || i > 0 && !strings.HasSuffix(changes[i-1], ">"+from) {
			t.Fatalf("change %d of %v", i, changes)
		}
	}
	if changes[0] != "closed>open" || changes[len(changes)-1] != "closed>open" || !slices.Contains(changes, "half-open>closed") {
		t.Errorf("changes %v", changes)
	}
}

// TestBreakerLateAndAbandoned: a late answer keeps the count of failures
// in a row and, to a half-open breaker's probe, opens it again; a probe
// abandoned lets the next request probe.
func TestBreakerLateAndAbandoned(t *testing.T) {
	var b breaker
	now := time.Unix(1000, 0)
	slow := errors.New("slow")
	for range breakerFailures - 1 {
		b.failure(now, slow)
		b.late(now, slow)
	}
	if b.failure(now, slow); b.current() != open {
		t.Fatalf("%v after %d failures with late answers between", b.current(), breakerFailures)
	}
	probe := now.Add(b.backoff)
	if b.abandon(); !b.allow(probe) || b.current() != halfOpen {
		t.Fatal("no probe after the back-off")
	}
	if b.abandon(); !b.allow(probe) {
		t.Fatal("no request probes after the probe was abandoned")
	}
	if b.late(probe, slow); b.current() != open || b.backoff != 2*breakerMinBackoff {
		t.Errorf("after a late probe: %v, back-off %v", b.current(), b.backoff)
	}
}

// TestPutBounded: Put never blocks and never queues more than the queue
// holds; what it cannot queue is counted as dropped, and what it queues is
// a copy, which the caller's later writes to its entry do not change.
func TestPutBounded(t *testing.T) {
	cfg, err := parse(t, "shared redis://127.0.0.1:1 {\n write_queue 4\n}")
	if err != nil {
		t.Fatal(err)
	}
	// No writer drains this tier's queue: New's goroutines are not started.
	tr := &Tier{cfg: cfg, m: newSeries(".", t.Name()), queue: make(chan queued, cfg.queue)}
	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	orig := slices.Clone(e)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			tr.Put(e)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Put blocked on a full queue")
	}
	if len(tr.queue) != 4 || tr.Stats().WritesDropped != 96 {
		t.Errorf("queued %d, dropped %d of 100 puts into a queue of 4", len(tr.queue), tr.Stats().WritesDropped)
	}
	e[len(e)-1] ^= 0xff
	if got := <-tr.queue; string(got.e) != string(orig) {
		t.Error("the queued entry changed with the caller's")
	}
}

// TestKeys: keys depend on the settings and the secret, every variant of a
// question shares one Cluster slot, and a value opens only under the key it
// was sealed for.
func TestKeys(t *testing.T) {
	secret := []byte(testSecret)
	k := newKeyer(secret, [32]byte{1})
	a, err := entry.KeyFor("www.example.org", dns.TypeA, dns.ClassINET, false)
	if err != nil {
		t.Fatal(err)
	}
	aaaa, _ := entry.KeyFor("www.example.org", dns.TypeAAAA, dns.ClassINET, false)
	v24 := entry.VariantKey(nil, a, 0, 1, 24, [16]byte{192, 0, 2, 0})
	v16 := entry.VariantKey(nil, a, 0, 1, 16, [16]byte{192, 0, 0, 0})
	slot := func(key string) string { return key[strings.IndexByte(key, '{') : strings.IndexByte(key, '}')+1] }

	if k.key(a) != k.key(slices.Clone(a)) || !strings.HasPrefix(k.key(a), k.prefix) {
		t.Errorf("key %q: not one key under the prefix %q", k.key(a), k.prefix)
	}
	distinct := map[string]string{}
	for what, key := range map[string]string{
		"A":                       k.key(a),
		"AAAA":                    k.key(aaaa),
		"a /24 variant":           k.key(v24),
		"a /16 variant":           k.key(v16),
		"another fingerprint":     newKeyer(secret, [32]byte{2}).key(a),
		"another secret":          newKeyer([]byte(testSecret+"x"), [32]byte{1}).key(a),
		"no secret":               newKeyer(nil, [32]byte{1}).key(a),
		"the name's epoch":        k.epochKey(epochName, a[:entry.FlagsAt(a)]),
		"the zone's epoch":        k.epochKey(epochZone, a[:entry.FlagsAt(a)]),
		"the flushes' stream":     k.streamKey(),
		"the stream of no secret": newKeyer(nil, [32]byte{1}).streamKey(),
	} {
		if other, dup := distinct[key]; dup {
			t.Errorf("%s and %s share the key %q", what, other, key)
		}
		distinct[key] = what
	}
	if slot(k.key(a)) != slot(k.key(v24)) || slot(k.key(a)) != slot(k.key(v16)) {
		t.Errorf("the variants of a question are in other slots: %q %q %q", k.key(a), k.key(v24), k.key(v16))
	}
	if slot(k.key(a)) == slot(k.key(aaaa)) {
		t.Errorf("two questions share the slot %q", slot(k.key(a)))
	}

	e := built(t, "www.example.org", dns.TypeA, dns.RcodeSuccess, uint32(time.Now().Unix()), 300)
	for _, kr := range []keyer{k, newKeyer(nil, [32]byte{1})} {
		key := kr.key(e.Key())
		v := kr.seal(key, e)
		if got, err := kr.open(key, e.Key(), v); err != nil || string(got) != string(e) {
			t.Errorf("secret %q: open of a sealed value: %v", kr.secret, err)
		}
		if _, err := kr.open(kr.key(aaaa), aaaa, v); err != errTag {
			t.Errorf("secret %q: a value opened under another key: %v", kr.secret, err)
		}
		for i := range v {
			bad := slices.Clone(v)
			bad[i] ^= 0x20
			if _, err := kr.open(key, e.Key(), bad); err == nil {
				t.Fatalf("secret %q: opened with byte %d changed", kr.secret, i)
			}
		}
	}
}

// TestKeysStable: the keys and tags are those replicas of earlier versions
// make, so that the replicas of a rolling upgrade share entries, epochs and
// flushes. A change of them is a change of format, for every replica at
// once.
func TestKeysStable(t *testing.T) {
	cacheKey := []byte("\x03www\x07example\x03org\x00\x00\x01\x00") // A, flags 0: class IN left out
	for _, tc := range []struct {
		k                                 keyer
		key, all, negative, zone, flushes string
		tag                               string
	}{
		{newKeyer([]byte(testSecret), [32]byte{1}), "cc:PMwf4mfZo5FK:{lSCIOAFK}6KgteIVkN4Lhu2bby4wu9A", "cc:PMwf4mfZo5FK:e:all:saLVMLsXX8uB_6ciKCk_fA",
			"cc:PMwf4mfZo5FK:e:negative:Q63niFddetrGxhTIgmia9w", "cc:PMwf4mfZo5FK:e:zone:0teGqUoyu8Pl1j5Gyv1c7w", "cc:PMwf4mfZo5FK:flushes", "3dca553476f02524c45965d71c1a9ec2"},
		{newKeyer(nil, [32]byte{1}), "cc:yqHPJrdd1x1L:{TtOaO1Tj}ZD0xoaHYge9qBGzYAOEhvg", "cc:yqHPJrdd1x1L:e:all:nj-0qi7g7kJlS03pTRqyvw",
			"cc:yqHPJrdd1x1L:e:negative:hUYrZNv0BxTMEe_d47hejQ", "cc:yqHPJrdd1x1L:e:zone:un_t-bDwWVaPAyFVhGegEw", "cc:yqHPJrdd1x1L:flushes", "341783d2f853f9ed68436b5b5dfd7c0f"},
	} {
		k := tc.k
		key := k.key(cacheKey)
		got := []string{key, k.epochKey(epochAll, nil), k.all, k.epochKey(epochNegative, nil), k.negative,
			k.epochKey(epochZone, []byte("\x03org\x00")), k.streamKey(), hex.EncodeToString(k.seal(key, []byte("entry"))[:tagLen])}
		want := []string{tc.key, tc.all, tc.all, tc.negative, tc.negative, tc.zone, tc.flushes, tc.tag}
		if !slices.Equal(got, want) {
			t.Errorf("secret %q:\n got %q\nwant %q", k.secret, got, want)
		}
	}
}

// TestKeysFingerprint: without a view or ports a block keeps the keys of
// its settings, those earlier versions made, so that a rolling upgrade
// keeps the tier and its flushes; views and ports, whatever their order,
// have keys of their own.
func TestKeysFingerprint(t *testing.T) {
	prefix := func(view string, ports ...string) string {
		return newKeyer(nil, keysFingerprint([32]byte{1}, view, ports)).prefix
	}
	for _, tc := range []struct {
		got, want string
	}{
		{prefix(""), "cc:yqHPJrdd1x1L:"},
		{prefix("internal"), "cc:8PCU5Tx9CZLK:"},
		{prefix("", "5353", "53"), prefix("", "53", "5353")},
		{prefix("", "53", "53"), prefix("", "53")},
	} {
		if tc.got != tc.want {
			t.Errorf("prefix %q, want %q", tc.got, tc.want)
		}
	}
	distinct := map[string]string{}
	for what, p := range map[string]string{
		"no view or port":    prefix(""),
		"port 53":            prefix("", "53"),
		"port 5353":          prefix("", "5353"),
		"ports 53 and 5353":  prefix("", "53", "5353"),
		"a view":             prefix("internal"),
		"a view on 53":       prefix("internal", "53"),
		"a view on 5353":     prefix("internal", "5353"),
		"another view on 53": prefix("external", "53"),
	} {
		if other, dup := distinct[p]; dup {
			t.Errorf("%s and %s share the prefix %q", what, other, p)
		}
		distinct[p] = what
	}
}

// TestApart: a block mixes its ports into its keys only when another block
// of its Corefile uses the same server on other ports.
func TestApart(t *testing.T) {
	cfg := &Config{addrs: []string{"127.0.0.1:6379"}}
	other := &Config{addrs: []string{"127.0.0.1:6380"}}
	otherDB := &Config{addrs: cfg.addrs, db: 1}
	for _, tc := range []struct {
		name   string
		blocks []*Config // the first is asked
		ports  [][]string
		want   []string
	}{
		{"alone", []*Config{cfg}, [][]string{{"5353"}}, nil},
		{"same server, other ports", []*Config{cfg, cfg}, [][]string{{"53"}, {"5353"}}, []string{"53"}},
		{"same server, same ports (other binds)", []*Config{cfg, cfg}, [][]string{{"53"}, {"53"}}, nil},
		{"other server", []*Config{cfg, other}, [][]string{{"53"}, {"5353"}}, nil},
		{"other database", []*Config{cfg, otherDB}, [][]string{{"53"}, {"5353"}}, nil},
	} {
		peers := new([]*Config)
		for i, b := range tc.blocks {
			c := *b
			c.ports, c.peers = tc.ports[i], peers
			*peers = append(*peers, &c)
		}
		if got := (*peers)[0].apart(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: apart %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := (&Config{ports: []string{"53"}}).apart(); got != nil {
		t.Errorf("a tier not parsed from a Corefile: apart %q, want none", got)
	}
}

// TestEpochLifeSaturates: an epoch outlives MaxTTL and the serve_stale
// window, a window near Go's longest duration (which serve_stale takes)
// included: the life saturates there rather than wrapping to a negative
// PX, which the tier refuses.
func TestEpochLifeSaturates(t *testing.T) {
	longest := int64(time.Duration(math.MaxInt64) / time.Second)
	for _, tc := range []struct {
		maxTTL, grace int64
		want          time.Duration
	}{
		{3600, 0, 3601 * time.Second},
		{3600, 60, 3661 * time.Second},
		{3600, longest - 3601, time.Duration(longest) * time.Second},
		{3600, longest, math.MaxInt64},
		{math.MaxUint32, longest, math.MaxInt64},
	} {
		tr := &Tier{opt: Options{MaxTTL: tc.maxTTL, Grace: tc.grace}}
		if got := tr.epochLife(); got != tc.want {
			t.Errorf("MaxTTL %d, grace %d: life %v (%d), want %v", tc.maxTTL, tc.grace, got, int64(got), tc.want)
		}
	}
}
