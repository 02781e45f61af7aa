package compactcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	_ "github.com/coredns/coredns/plugin/cache" // registers the stock cache's directive
	corednsedns "github.com/coredns/coredns/plugin/pkg/edns"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
)

// The differential test: one table of scenarios, each a Corefile fragment
// and a script of steps, run against the stock cache plugin of CoreDNS and
// against compactcache. Both are built from the same Corefile text by their
// registered setup functions, sit in front of the same scripted upstream and
// read the same fake clock. After every query the test compares what the
// client saw (rcode, header bits, question, sections with TTLs, OPT with its
// options, how many replies were written) and how many queries reached the
// upstream during the step (background refreshes included). A difference
// passes only when the step lists it as intended (diffReasons, the README's
// "Differences from cache"); a difference that is a bug is listed in diffBugs
// and its step fails until it is fixed.

// TestDifferential runs every scenario against the stock cache and against
// compactcache twice, with hits written through WriteMsg and as raw bytes.
func TestDifferential(t *testing.T) {
	// A local EDNS option that CoreDNS may copy from requests to replies, as
	// the rewrite plugin's edns0 rules register theirs.
	corednsedns.SetSupportedOption(diffOption)
	baseline := backgroundGoroutines(nil)
	for _, sc := range diffScenarios {
		t.Run(sc.name, func(t *testing.T) {
			stock := runScenario(t, sc, "cache", false, baseline)
			compact := runScenario(t, sc, pluginName, false, baseline)
			raw := runScenario(t, sc, pluginName, true, baseline)
			for i, st := range sc.steps {
				if st.ask == "" {
					continue
				}
				where := fmt.Sprintf("step %d (%s)", i, st.ask)
				if stock[i].up != st.up {
					t.Errorf("%s: the stock cache's upstream got %d queries, the table says %d", where, stock[i].up, st.up)
				}
				if r, c := raw[i].String(), compact[i].String(); r != c {
					t.Errorf("%s: compactcache with raw writes differs from WriteMsg:\n%s\nraw:\n%s", where, c, r)
				}
				// DIFFDEBUG=1 logs what both caches showed at every step.
				if os.Getenv("DIFFDEBUG") != "" {
					t.Logf("%s:\nstock:\n%scompact:\n%s", where, stock[i], compact[i])
				}
				checkStep(t, where, st, stock[i], compact[i])
			}
		})
	}
}

// diffOption is the code of the local EDNS option the flag "opt" adds to a
// query (RFC 6891 local/experimental range).
const diffOption = 0xfde9

// diffScenario is a Corefile fragment and the steps run against it.
type diffScenario struct {
	name string
	// corefile is what follows the directive: [TTL] [ZONES...] and the
	// options block. The server block is ".".
	corefile string
	steps    []diffStep
}

// diffStep is one step of a scenario, done in this order: advance the clock,
// change the upstream, hold or release it, ask.
type diffStep struct {
	advance time.Duration
	set     string // "name type": the upstream answers it with to from now on
	to      diffAnswer
	hold    string // "name type": the upstream holds queries for it until release
	release bool
	// ask is a query: "name type" and flags +do, +cd, +ad, -edns (no OPT),
	// tcp, bufsize=N, opt (a local EDNS option, diffOption), badecs (a
	// malformed ECS option), 2q (a second question). The default is UDP with EDNS, buffer 1232, RD set.
	ask string
	up  int // queries the stock cache's upstream gets in this step
	// diff lists the intended differences the step shows (diffReasons).
	diff []string
	// bug names a difference of diffBugs: the step fails while it shows.
	bug string
}

// diffAnswer is the upstream's script for one question.
type diffAnswer struct {
	rcode      int
	an, ns, ex []string // records in zone file syntax
	aa         bool
	// signed answers DO queries with an RRSIG after each RRset (NSEC and
	// RRSIG records of the script go to DO queries only) and sets AD for
	// queries with AD or DO, as a validating resolver does.
	signed  bool
	expired bool   // the RRSIGs of a signed answer expired a day ago
	fail    bool   // fail without writing, as forward does on an upstream timeout
	tc      bool   // over UDP: an empty truncated reply
	ede     uint16 // an Extended DNS Error option in the reply, for EDNS queries
	// question, when set, replaces the name in the reply's question.
	question string
}

// Intended differences, after the README's "Differences from cache". Each
// gives its reason and erases the effects it has on what the client sees and
// on the upstream's count; checkStep erases the reasons a step lists, requires
// the rest to be equal, and requires each listed reason to be needed.
//
// One README difference is not in the table: entry caps ("entry counts apply
// only when given", and then per shard of the store). Which entries share a
// shard depends on a per-process random hash seed, so no fixed script shows
// it deterministically.
var diffReasons = map[string]struct {
	why   string
	erase func(st, cc *diffView)
}{
	"ede-stale": {
		"RFC 8914: a stale answer to an EDNS client carries EDE 3 (Stale Answer); the stock cache adds no EDE",
		eraseEDE(edeStaleAnswer),
	},
	"ede-stale-nxdomain": {
		"RFC 8914: a stale NXDOMAIN to an EDNS client carries EDE 19 (Stale NXDOMAIN Answer); the stock cache adds no EDE",
		eraseEDE(edeStaleNXDomain),
	},
	"ede-cached-error": {
		"RFC 8914: a SERVFAIL answered from the cache carries EDE 13 (Cached Error); the stock cache adds no EDE",
		eraseEDE(edeCachedError),
	},
	"stale-ttl": {
		"serve_stale RESPONSE_TTL defaults to 30s as RFC 8767 section 4 recommends; the stock default is 0",
		eraseStaleTTL,
	},
	"ttl-top-bit": {
		"a TTL with the top bit set counts as 0 (RFC 2181 8), so the entry lives MINTTL; the stock cache compares it as a large number and caches for the TTL cap",
		diffAll(eraseLowerTTL, eraseQueries),
	},
	"soa-minimum": {
		"negative TTLs follow RFC 2308 section 5: the SOA counts with min(TTL, MINIMUM); the stock cache ignores MINIMUM, so the entry expires earlier",
		diffAll(eraseTTLs, eraseQueries),
	},
	"do-one-entry": {
		"one entry serves DO and non-DO clients once it holds the DNSSEC records: stored for a DO client, or from a reply with none (misses go upstream with DO=1); the stock cache keys on DO and asks again",
		eraseQueries,
	},
	"do-upstream": {
		"misses go upstream with DO=1 whatever the client's DO, so a reply whose signatures expired is seen as such and not cached; the stock cache asks without DO for a client without it and caches the reply",
		eraseQueries,
	},
	"notimp": {
		"only SERVFAIL is cached as an error; the stock cache also caches NOTIMP for the servfail time",
		eraseQueries,
	},
	"owner-case": {
		"owners equal to the question take the case of the client's question; the stock cache keeps the case of the reply it cached",
		eraseOwnerCase,
	},
	"tcp-retry": {
		"a reply truncated by the upstream is asked again over TCP and cached; the stock cache passes the truncated reply on and caches nothing",
		eraseTCPRetry,
	},
	"failed-refresh": {
		"a refresh (prefetch, serve_stale) that fails stores nothing and leaves the entry it would replace (RFC 8767 4); the stock cache's prefetch stores the SERVFAIL beside the answer and serves it once the answer expires",
		eraseQueries,
	},
	"uncached-ttl": {
		"a reply the cache does not store reaches the client with the upstream's TTLs; the stock cache caps them at the duration it would have cached the reply for, 5s for replies it classes as errors",
		eraseTTLs,
	},
	"failure-recheck": {
		"after a refresh of an entry fails, no other starts for FAILURE_RECHECK (default 1s: bounded upstream queries per entry when the upstream is down); the stock cache's default 0 lets every request refresh, and verify mode ask, again",
		eraseQueries,
	},
	"foreign-servfail": {
		"a reply to another question than the client's is answered SERVFAIL, as Unbound answers it; the stock cache passes it on, for the client to drop",
		eraseForeign,
	},
	"non-answer": {
		"a NOERROR whose answer has neither the type asked nor a CNAME at the name, and no SOA, is counted in drops and refreshes no entry, so verify serves the stale entry and FAILURE_RECHECK holds back the next; the stock cache takes it as a refresh and its verify passes it on",
		eraseNonAnswer,
	},
	"truncation": {
		"a reply cut to the client's size drops whole RRsets and sets TC only when the answer or authority loses one (RFC 2181 9, as Unbound); the stock cache's dns.Msg.Truncate keeps the records of a partial RRset that fit and sets TC for any record left out",
		eraseTruncation,
	},
}

// diffBugs are differences that are not intended. A step marked with one
// fails while compactcache shows it.
var diffBugs = map[string]string{}

// The scenarios. Every ask says how many queries the stock cache's upstream
// gets (up); compactcache must get as many unless a listed reason says
// otherwise.
var diffScenarios = []diffScenario{
	{
		name: "positive",
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{advance: 10 * time.Second, ask: "a.example.org. A", up: 0},
			{advance: 10 * time.Second, ask: "a.example.org. A -edns", up: 0},
			{ask: "a.example.org. A tcp", up: 0},
			{ask: "a.example.org. A bufsize=4096", up: 0},
			{ask: "a.example.org. AAAA", up: 1},
			{ask: "a.example.org. AAAA", up: 0},
			{ask: "example.org. MX", up: 1},
			{advance: time.Second, ask: "example.org. MX", up: 0},
			{ask: "aa.example.org. A", up: 1},
			{ask: "aa.example.org. A", up: 0},
			{ask: "example.org. NS", up: 1},
			{ask: "example.org. NS", up: 0},
			{ask: "any.example.org. ANY", up: 1},
			{ask: "any.example.org. ANY", up: 0},
			// A referral: cached as a success.
			{ask: "sub.example.org. A", up: 1},
			{advance: 10 * time.Second, ask: "sub.example.org. A", up: 1},
			// NOERROR without records or SOA: cached for the minimum TTL.
			{ask: "empty.example.org. A", up: 1},
			{advance: 4 * time.Second, ask: "empty.example.org. A", up: 0},
			{advance: time.Second, ask: "empty.example.org. A", up: 1},
		},
	},
	{
		name: "owner case from the client",
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{ask: "A.Example.ORG. A", up: 0, diff: []string{"owner-case"}},
			{ask: "WWW.example.org. A", up: 1, diff: []string{"owner-case"}},
			{ask: "www.example.org. A", up: 0},
			// Names other than the question's keep the case they came with.
			{ask: "www.EXAMPLE.org. A", up: 0, diff: []string{"owner-case"}},
		},
	},
	{
		name: "NXDOMAIN",
		steps: []diffStep{
			{ask: "nx.example.org. A", up: 1},
			{advance: 30 * time.Second, ask: "nx.example.org. A", up: 0},
			{ask: "nx.example.org. A -edns", up: 0},
			{advance: 30 * time.Second, ask: "nx.example.org. A", up: 1},
			{ask: "nx.example.org. AAAA", up: 1},
		},
	},
	{
		name: "NODATA",
		steps: []diffStep{
			{ask: "a.example.org. MX", up: 1},
			{advance: 59 * time.Second, ask: "a.example.org. MX", up: 0},
			{advance: time.Second, ask: "a.example.org. MX", up: 1},
		},
	},
	{
		name: "denial TTL from SOA MINIMUM",
		steps: []diffStep{
			{ask: "soamin.example.org. A", up: 1, diff: []string{"soa-minimum"}},
			{advance: 20 * time.Second, ask: "soamin.example.org. A", up: 0, diff: []string{"soa-minimum"}},
			{advance: 20 * time.Second, ask: "soamin.example.org. A", up: 0, diff: []string{"soa-minimum"}},
		},
	},
	{
		name: "denial TTLs",
		corefile: `{
    denial 100 40 10
}`,
		steps: []diffStep{
			{ask: "nx.example.org. A", up: 1},
			{advance: 39 * time.Second, ask: "nx.example.org. A", up: 0},
			{advance: time.Second, ask: "nx.example.org. A", up: 1},
			{ask: "short-nx.example.org. A", up: 1},
			{advance: 5 * time.Second, ask: "short-nx.example.org. A", up: 0},
			{advance: 5 * time.Second, ask: "short-nx.example.org. A", up: 1},
		},
	},
	{
		name: "SERVFAIL from the upstream",
		steps: []diffStep{
			// Records of a SERVFAIL are served with its TTL, as the stock
			// cache serves them, not with their own shorter one.
			{ask: "failrr.example.org. A", up: 1},
			{advance: 3 * time.Second, ask: "failrr.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
			{ask: "fail.example.org. A", up: 1},
			{ask: "fail.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
			{ask: "fail.example.org. A -edns", up: 0},
			{advance: 4 * time.Second, ask: "fail.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
			{advance: time.Second, ask: "fail.example.org. A", up: 1},
			{ask: "fail.example.org. A -edns", up: 0},
			{set: "fail.example.org. A", to: diffAnswer{an: []string{"fail.example.org. 300 IN A 192.0.2.7"}}},
			{advance: 5 * time.Second, ask: "fail.example.org. A", up: 1},
			{ask: "fail.example.org. A", up: 0},
		},
	},
	{
		name: "SERVFAIL with the upstream's EDE",
		steps: []diffStep{
			// Neither passes the upstream's EDE 22 on: the stock cache drops
			// the upstream's OPT and the server adds the client's.
			{ask: "ede.example.org. A", up: 1},
			{ask: "ede.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
		},
	},
	{
		name: "servfail time",
		corefile: `{
    servfail 10s
}`,
		steps: []diffStep{
			{ask: "fail.example.org. A", up: 1},
			{advance: 9 * time.Second, ask: "fail.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
			{advance: time.Second, ask: "fail.example.org. A", up: 1},
		},
	},
	{
		name: "servfail 0",
		corefile: `{
    servfail 0
}`,
		steps: []diffStep{
			{ask: "fail.example.org. A", up: 1},
			{ask: "fail.example.org. A", up: 1},
			{ask: "down.example.org. A", up: 1},
			{ask: "down.example.org. A", up: 1},
		},
	},
	{
		// Stored with TTL 0, stale at once: served only under serve_stale.
		name: "servfail under a second",
		corefile: `{
    servfail 500ms
    serve_stale 1h immediate 0s 0s
}`,
		steps: []diffStep{
			{ask: "fail.example.org. A", up: 1},
			{set: "fail.example.org. A", to: diffAnswer{an: []string{"fail.example.org. 300 IN A 192.0.2.7"}}},
			{ask: "fail.example.org. A", up: 1, diff: []string{"ede-cached-error"}},
			{ask: "fail.example.org. A", up: 0},
		},
	},
	{
		name: "next plugin fails without writing",
		steps: []diffStep{
			{ask: "down.example.org. A", up: 1},
			{ask: "down.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
			{ask: "down.example.org. A -edns", up: 0},
			{advance: 5 * time.Second, ask: "down.example.org. A", up: 1},
		},
	},
	{
		name: "NOTIMP is not cached",
		steps: []diffStep{
			{ask: "notimp.example.org. A", up: 1},
			{ask: "notimp.example.org. A", up: 0, diff: []string{"notimp"}},
		},
	},
	{
		name: "expiry and TTL limits",
		corefile: `60 {
    success 100 60 10
}`,
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{advance: 59 * time.Second, ask: "a.example.org. A", up: 0},
			{advance: time.Second, ask: "a.example.org. A", up: 1},
			{ask: "low.example.org. A", up: 1},
			{advance: 5 * time.Second, ask: "low.example.org. A", up: 0},
			{advance: 5 * time.Second, ask: "low.example.org. A", up: 1},
			{ask: "zero.example.org. A", up: 1},
			{advance: 9 * time.Second, ask: "zero.example.org. A", up: 0},
		},
	},
	{
		name: "prefetch",
		corefile: `{
    prefetch 2 1m 50%
}`,
		steps: []diffStep{
			{ask: "pop.example.org. A", up: 1},
			{advance: 10 * time.Second, ask: "pop.example.org. A", up: 0},
			{set: "pop.example.org. A", to: diffAnswer{an: []string{"pop.example.org. 100 IN A 192.0.2.101"}}},
			// The second hit within a minute, 45s left of 100: prefetched.
			{advance: 45 * time.Second, ask: "pop.example.org. A", up: 1},
			{advance: time.Second, ask: "pop.example.org. A", up: 0},
			// Popularity is kept: the next hits near expiry prefetch again.
			{set: "pop.example.org. A", to: diffAnswer{an: []string{"pop.example.org. 100 IN A 192.0.2.102"}}},
			{advance: 50 * time.Second, ask: "pop.example.org. A", up: 1},
			{advance: time.Second, ask: "pop.example.org. A", up: 0},
			// A gap longer than the window: popularity starts over.
			{advance: 98 * time.Second, ask: "pop.example.org. A", up: 0},
			{advance: time.Second, ask: "pop.example.org. A", up: 1},
		},
	},
	{
		name: "prefetch: one fetch in flight",
		corefile: `{
    prefetch 1 1m 10%
}`,
		steps: []diffStep{
			{ask: "pop.example.org. A", up: 1},
			{set: "pop.example.org. A", to: diffAnswer{an: []string{"pop.example.org. 100 IN A 192.0.2.101"}}},
			{advance: 91 * time.Second, hold: "pop.example.org. A", ask: "pop.example.org. A", up: 1},
			{ask: "pop.example.org. A", up: 0},
			{advance: time.Second, ask: "pop.example.org. A", up: 0},
			{release: true},
			{ask: "pop.example.org. A", up: 0},
		},
	},
	{
		name: "prefetch fails with SERVFAIL near expiry",
		corefile: `{
    prefetch 1 1m 10%
}`,
		steps: []diffStep{
			{ask: "pop.example.org. A", up: 1},
			{set: "pop.example.org. A", to: diffAnswer{rcode: dns.RcodeServerFailure}},
			{advance: 97 * time.Second, ask: "pop.example.org. A", up: 1},
			{advance: 2 * time.Second, ask: "pop.example.org. A", up: 1},
			{advance: 2 * time.Second, ask: "pop.example.org. A", up: 0, diff: []string{"failed-refresh"}},
		},
	},
	{
		name: "prefetch amount 1, failing refresh",
		corefile: `{
    prefetch 1 10s 10%
}`,
		steps: []diffStep{
			{ask: "pop.example.org. A", up: 1},
			{advance: 89 * time.Second, ask: "pop.example.org. A", up: 0},
			{set: "pop.example.org. A", to: diffAnswer{fail: true}},
			{advance: time.Second, ask: "pop.example.org. A", up: 1},
			{advance: time.Second, ask: "pop.example.org. A", up: 1},
			{set: "pop.example.org. A", to: diffAnswer{rcode: dns.RcodeServerFailure}},
			{advance: time.Second, ask: "pop.example.org. A", up: 1},
			{advance: time.Second, ask: "pop.example.org. A", up: 1},
			{set: "pop.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError, ns: []string{diffSOA}}},
			{advance: time.Second, ask: "pop.example.org. A", up: 1},
			{ask: "pop.example.org. A", up: 0},
		},
	},
	{
		name: "serve_stale immediate",
		corefile: `{
    serve_stale 1h immediate
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.31"}}},
			{advance: 40 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{advance: time.Second, ask: "short.example.org. A", up: 0},
			{set: "short.example.org. A", to: diffAnswer{fail: true}},
			{advance: 40 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{ask: "short.example.org. A -edns", up: 1, diff: []string{"failure-recheck", "stale-ttl"}},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeServerFailure}},
			{ask: "short.example.org. A", up: 1, diff: []string{"failure-recheck", "ede-stale", "stale-ttl"}},
			{ask: "nx.example.org. A", up: 1},
			{advance: 70 * time.Second, ask: "nx.example.org. A", up: 1, diff: []string{"ede-stale-nxdomain", "stale-ttl"}},
			{ask: "nx.example.org. A", up: 0},
			{advance: time.Hour, ask: "short.example.org. A", up: 1},
			{ask: "short.example.org. A", up: 0, diff: []string{"ede-cached-error"}},
		},
	},
	{
		name: "serve_stale immediate with RESPONSE_TTL and FAILURE_RECHECK",
		corefile: `{
    serve_stale 2m immediate 10s 30s
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{fail: true}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale"}},
			{advance: 10 * time.Second, ask: "short.example.org. A", up: 0, diff: []string{"ede-stale"}},
			{advance: 20 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale"}},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.32"}}},
			{advance: 29 * time.Second, ask: "short.example.org. A", up: 0, diff: []string{"ede-stale"}},
			{advance: time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale"}},
			{ask: "short.example.org. A", up: 0},
			// Beyond the stale window: a miss.
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.33"}}},
			{advance: 151 * time.Second, ask: "short.example.org. A", up: 1},
		},
	},
	{
		name: "serve_stale immediate: one refresh in flight",
		corefile: `{
    serve_stale
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.31"}}},
			{advance: 31 * time.Second, hold: "short.example.org. A", ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{ask: "short.example.org. A", up: 0, diff: []string{"ede-stale", "stale-ttl"}},
			{advance: time.Second, ask: "short.example.org. A -edns", up: 0, diff: []string{"stale-ttl"}},
			{release: true},
			{ask: "short.example.org. A", up: 0},
		},
	},
	{
		name: "serve_stale with DNSSEC",
		corefile: `{
    serve_stale 1h immediate
}`,
		steps: []diffStep{
			{ask: "s.example.org. A +do", up: 1},
			{ask: "s.example.org. A", up: 1, diff: []string{"do-one-entry"}},
			{set: "s.example.org. A", to: diffAnswer{fail: true}},
			{advance: 301 * time.Second, ask: "s.example.org. A +do", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{ask: "s.example.org. A", up: 1, diff: []string{"failure-recheck", "ede-stale", "stale-ttl"}},
		},
	},
	{
		name: "serve_stale and cached SERVFAIL",
		corefile: `{
    serve_stale 1h immediate
}`,
		steps: []diffStep{
			{ask: "down.example.org. A", up: 1},
			// Expired, the SERVFAIL is served stale by both, and refreshed.
			{advance: 6 * time.Second, ask: "down.example.org. A", up: 1, diff: []string{"ede-cached-error"}},
			{ask: "down.example.org. A -edns", up: 1, diff: []string{"failure-recheck"}},
			{set: "down.example.org. A", to: diffAnswer{an: []string{"down.example.org. 300 IN A 192.0.2.6"}}},
			// Past the failure recheck, both refresh again.
			{advance: time.Second, ask: "down.example.org. A", up: 1, diff: []string{"ede-cached-error"}},
			{ask: "down.example.org. A", up: 0},
		},
	},
	{
		name: "serve_stale verify",
		corefile: `{
    serve_stale 1h verify
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.31"}}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1},
			{ask: "short.example.org. A", up: 0},
			{set: "short.example.org. A", to: diffAnswer{fail: true}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeServerFailure}},
			{ask: "short.example.org. A", up: 1, diff: []string{"failure-recheck", "ede-stale", "stale-ttl"}},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError, ns: []string{diffSOA}}},
			// Past the failure recheck, both verify again.
			{advance: time.Second, ask: "short.example.org. A", up: 1},
			{ask: "short.example.org. A", up: 0},
		},
	},
	{
		// A reply response.Typify classes as an error (NXDOMAIN with a
		// CNAME) does not refresh: the stale entry is served.
		name: "serve_stale verify, error reply",
		corefile: `{
    serve_stale 1h verify
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError, an: []string{"short.example.org. 300 IN CNAME gone.example.org."}, ns: []string{diffSOA}}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
		},
	},
	{
		// A NOERROR whose answer holds only another name's records, without
		// an SOA, refreshes nothing: the stale entry is served.
		name: "serve_stale verify, an answer for another name only",
		corefile: `{
    serve_stale 1h verify
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"other.example.org. 300 IN A 192.0.2.66"}}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"non-answer"}},
			{ask: "short.example.org. A", up: 1, diff: []string{"non-answer", "failure-recheck"}},
		},
	},
	{
		name: "serve_stale verify with timeout",
		corefile: `{
    serve_stale 1h verify 20ms 5s
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.31"}}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.32"}}},
			{advance: 31 * time.Second, hold: "short.example.org. A", ask: "short.example.org. A", up: 1, diff: []string{"ede-stale"}},
			// The fetch is in flight: no second one.
			{ask: "short.example.org. A", up: 0, diff: []string{"ede-stale"}},
			{release: true},
			{ask: "short.example.org. A", up: 0},
		},
	},
	{
		name: "serve_stale_policy prefer_positive",
		corefile: `{
    serve_stale 1h immediate
    serve_stale_policy prefer_positive
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError, ns: []string{diffSOA}}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{ask: "short.example.org. A", up: 1, diff: []string{"failure-recheck", "ede-stale", "stale-ttl"}},
		},
	},
	{
		name: "serve_stale_policy prefer_positive, verify",
		corefile: `{
    serve_stale 1h verify
    serve_stale_policy prefer_positive
}`,
		steps: []diffStep{
			{ask: "short.example.org. A", up: 1},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError, ns: []string{diffSOA}}},
			{advance: 31 * time.Second, ask: "short.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
			{ask: "short.example.org. A", up: 1, diff: []string{"failure-recheck", "ede-stale", "stale-ttl"}},
			{set: "short.example.org. A", to: diffAnswer{an: []string{"short.example.org. 30 IN A 192.0.2.31"}}},
			// Past the failure recheck, both verify again.
			{advance: time.Second, ask: "short.example.org. A", up: 1},
			{ask: "short.example.org. A", up: 0},
			{ask: "nx.example.org. A", up: 1},
			{ask: "nx.example.org. A", up: 0},
		},
	},
	{
		name: "disable success",
		corefile: `{
    disable success example.org
}`,
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{ask: "a.example.org. A", up: 1},
			{ask: "nx.example.org. A", up: 1},
			{ask: "nx.example.org. A", up: 0},
			{ask: "a.example.net. A", up: 1},
			{ask: "a.example.net. A", up: 0},
		},
	},
	{
		name: "disable denial",
		corefile: `{
    disable denial
}`,
		steps: []diffStep{
			{ask: "nx.example.org. A", up: 1},
			{ask: "nx.example.org. A", up: 1},
			{ask: "a.example.org. MX", up: 1},
			{ask: "a.example.org. MX", up: 1},
			{ask: "fail.example.org. A", up: 1},
			{ask: "fail.example.org. A", up: 1},
			{ask: "a.example.org. A", up: 1},
			{ask: "a.example.org. A", up: 0},
		},
	},
	{
		name: "keepttl",
		corefile: `{
    keepttl
}`,
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{advance: 100 * time.Second, ask: "a.example.org. A", up: 0},
			{ask: "nx.example.org. A", up: 1},
			{advance: 59 * time.Second, ask: "nx.example.org. A", up: 0},
			{ask: "www.example.org. A", up: 1},
			{advance: 30 * time.Second, ask: "www.example.org. A", up: 0},
		},
	},
	{
		name: "keepttl with prefetch",
		corefile: `{
    keepttl
    prefetch 1 1m 10%
}`,
		steps: []diffStep{
			{ask: "pop.example.org. A", up: 1},
			{set: "pop.example.org. A", to: diffAnswer{an: []string{"pop.example.org. 100 IN A 192.0.2.101"}}},
			{advance: 91 * time.Second, ask: "pop.example.org. A", up: 1},
			{advance: time.Second, ask: "pop.example.org. A", up: 0},
		},
	},
	{
		name: "keepttl with serve_stale",
		corefile: `{
    keepttl
    serve_stale 1h verify
}`,
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{set: "a.example.org. A", to: diffAnswer{fail: true}},
			{advance: 301 * time.Second, ask: "a.example.org. A", up: 1, diff: []string{"ede-stale", "stale-ttl"}},
		},
	},
	{
		name:     "zones",
		corefile: "30 example.org",
		steps: []diffStep{
			{ask: "a.example.org. A", up: 1},
			{advance: 29 * time.Second, ask: "a.example.org. A", up: 0},
			{advance: time.Second, ask: "a.example.org. A", up: 1},
			{ask: "a.example.net. A", up: 1},
			{ask: "a.example.net. A", up: 1},
			{ask: "nx.example.org. A", up: 1},
			{ask: "nx.example.org. A", up: 0},
		},
	},
	{
		name: "CNAME chains",
		steps: []diffStep{
			{ask: "www.example.org. A", up: 1},
			{advance: 20 * time.Second, ask: "www.example.org. A", up: 0},
			{advance: 40 * time.Second, ask: "www.example.org. A", up: 1},
			// A chain that does not reach the type, without SOA: not cached.
			{ask: "dangling.example.org. A", up: 1},
			{ask: "dangling.example.org. A", up: 1},
			// With an SOA: NODATA, cached as a denial.
			{ask: "cnodata.example.org. A", up: 1},
			{ask: "cnodata.example.org. A", up: 0},
			{ask: "www.example.org. CNAME", up: 1},
			{ask: "www.example.org. CNAME", up: 0},
			// The type beside the CNAME at an owner of the chain, and an
			// alias with two targets (RFC 2181 10.1): no answer, not cached.
			{ask: "beside.example.org. A", up: 1},
			{ask: "beside.example.org. A", up: 1},
			{ask: "twotargets.example.org. CNAME", up: 1},
			{ask: "twotargets.example.org. CNAME", up: 1},
		},
	},
	{
		name: "DO",
		steps: []diffStep{
			{ask: "s.example.org. A +do", up: 1},
			{ask: "s.example.org. A +do", up: 0},
			{ask: "s.example.org. A", up: 1, diff: []string{"do-one-entry"}},
			{ask: "s.example.org. A", up: 0},
			{ask: "s.example.org. A +ad", up: 0},
			{ask: "s.example.org. A -edns", up: 0},
			{ask: "s.example.org. RRSIG", up: 1},
			{ask: "s.example.org. RRSIG", up: 0},
			// Stored for a client without DO, without its NSEC: the first
			// DO client fetches it again, and the entry it stores serves
			// both kinds of client.
			{ask: "snx.example.org. A", up: 1},
			{ask: "snx.example.org. A +do", up: 1},
			{ask: "snx.example.org. A", up: 0},
			{ask: "snx.example.org. A +do", up: 0},
			{ask: "s2.example.org. A -edns", up: 1},
			{ask: "s2.example.org. A +do", up: 1},
			{ask: "s2.example.org. A", up: 0},
			{ask: "s2.example.org. A +do", up: 0},
			// A reply without DNSSEC records is all a DO client gets: the
			// entry a client without DO filled serves it.
			{ask: "u.example.org. A", up: 1},
			{ask: "u.example.org. A +do", up: 1, diff: []string{"do-one-entry"}},
			{ask: "u.example.org. A +do", up: 0},
			{advance: 10 * time.Second, ask: "s.example.org. A +do", up: 0},
		},
	},
	{
		// RFC 3225 3: the security records of an ANY answer are included
		// whatever the DO bit, as Unbound includes them.
		name: "signed ANY",
		steps: []diffStep{
			{ask: "sany.example.org. ANY", up: 1},
			{ask: "sany.example.org. ANY", up: 0},
			{ask: "sany.example.org. ANY +do", up: 1, diff: []string{"do-one-entry"}},
			{ask: "sany.example.org. ANY -edns", up: 0},
		},
	},
	{
		name: "expired signatures",
		steps: []diffStep{
			// compactcache asks with DO=1 and sees the expired RRSIG, which
			// response.Typify classes as an error: nothing is cached.
			{ask: "old.example.org. A", up: 1},
			{ask: "old.example.org. A", up: 0, diff: []string{"do-upstream"}},
			{ask: "old.example.org. A +do", up: 1, diff: []string{"uncached-ttl"}},
			{ask: "old.example.org. A +do", up: 1, diff: []string{"uncached-ttl"}},
		},
	},
	{
		name: "CD",
		steps: []diffStep{
			{ask: "s.example.org. A +cd +do", up: 1},
			{ask: "s.example.org. A +cd +do", up: 0},
			{ask: "s.example.org. A +do", up: 1},
			{ask: "s.example.org. A +cd", up: 1, diff: []string{"do-one-entry"}},
			{ask: "s.example.org. A", up: 1, diff: []string{"do-one-entry"}},
			{ask: "s.example.org. A +cd", up: 0},
		},
	},
	{
		name: "MINTTL 0",
		corefile: `{
    success 100 3600 0
    denial 100 1800 0
}`,
		steps: []diffStep{
			{ask: "zero.example.org. A", up: 1},
			{ask: "zero.example.org. A", up: 1},
			{ask: "zero-nx.example.org. A", up: 1},
			{ask: "zero-nx.example.org. A", up: 1},
		},
	},
	{
		// A referral lives 5 s, as in the stock cache, its records served
		// with the entry's TTL, not with their own shorter one.
		name: "referral with MINTTL 0",
		corefile: `{
    success 100 3600 0
}`,
		steps: []diffStep{
			{ask: "shortsub.example.org. A", up: 1},
			{advance: 3 * time.Second, ask: "shortsub.example.org. A", up: 0},
			{advance: 2 * time.Second, ask: "shortsub.example.org. A", up: 1},
		},
	},
	{
		name: "MINTTL 0 with serve_stale",
		corefile: `{
    success 100 3600 0
    serve_stale 1h immediate
}`,
		steps: []diffStep{
			{ask: "zero.example.org. A", up: 1},
			{ask: "zero.example.org. A", up: 1},
			{advance: time.Second, ask: "zero.example.org. A", up: 1},
		},
	},
	{
		name: "TTL with the top bit set",
		steps: []diffStep{
			{ask: "topbit.example.org. A", up: 1, diff: []string{"ttl-top-bit"}},
			{advance: 10 * time.Second, ask: "topbit.example.org. A", up: 0, diff: []string{"ttl-top-bit"}},
		},
	},
	{
		name: "replies that are not cached",
		steps: []diffStep{
			{ask: "spoof.example.org. A", up: 1, diff: []string{"foreign-servfail"}},
			{ask: "spoof.example.org. A", up: 1, diff: []string{"foreign-servfail"}},
			// NXDOMAIN with a CNAME: an error to response.Typify.
			{ask: "cnx.example.org. A", up: 1, diff: []string{"uncached-ttl"}},
			{ask: "cnx.example.org. A", up: 1, diff: []string{"uncached-ttl"}},
		},
	},
	{
		name: "request options echoed",
		steps: []diffStep{
			{ask: "a.example.org. A opt", up: 1},
			{ask: "a.example.org. A opt", up: 0},
			{ask: "a.example.org. A opt +do", up: 1, diff: []string{"do-one-entry"}},
			{ask: "a.example.org. A", up: 0},
		},
	},
	{
		name: "truncated upstream reply",
		steps: []diffStep{
			{ask: "tc.example.org. A", up: 1, diff: []string{"tcp-retry"}},
			{ask: "tc.example.org. A", up: 1, diff: []string{"tcp-retry"}},
			{ask: "tc.example.org. A tcp", up: 1, diff: []string{"tcp-retry"}},
			{ask: "tc.example.org. A tcp", up: 0},
		},
	},
	{
		name: "large answer to a small client",
		steps: []diffStep{
			{ask: "big.example.org. TXT -edns", up: 1, diff: []string{"truncation"}},
			{ask: "big.example.org. TXT -edns", up: 0, diff: []string{"truncation"}},
			{ask: "big.example.org. TXT bufsize=1232", up: 0},
			{ask: "big.example.org. TXT bufsize=256", up: 0, diff: []string{"truncation"}},
			{ask: "big.example.org. TXT +do bufsize=700", up: 1, diff: []string{"do-one-entry", "truncation"}},
			{ask: "big.example.org. TXT tcp", up: 0},
			// Only additional records left out: TC in the stock cache's.
			{ask: "glue.example.org. NS -edns", up: 1, diff: []string{"truncation"}},
			{ask: "glue.example.org. NS -edns", up: 0, diff: []string{"truncation"}},
			{ask: "glue.example.org. NS bufsize=1232", up: 0},
		},
	},
}

// The upstream's zone: every scenario starts from it.
const diffSOA = "example.org. 60 IN SOA ns.example.org. hostmaster.example.org. 1 7200 3600 1209600 60"

func diffZone() map[string]diffAnswer {
	big := make([]string, 8)
	for i := range big {
		big[i] = fmt.Sprintf(`big.example.org. 300 IN TXT "%d%s"`, i, strings.Repeat("x", 100))
	}
	glue := make([]string, 40)
	for i := range glue {
		glue[i] = fmt.Sprintf("ns.glue.example.org. 300 IN A 192.0.2.%d", 100+i)
	}
	return map[string]diffAnswer{
		"a.example.org. A":     {an: []string{"a.example.org. 300 IN A 192.0.2.1", "a.example.org. 300 IN A 192.0.2.2"}},
		"a.example.org. AAAA":  {an: []string{"a.example.org. 300 IN AAAA 2001:db8::1"}},
		"a.example.org. MX":    {ns: []string{diffSOA}},
		"any.example.org. ANY": {an: []string{"any.example.org. 300 IN A 192.0.2.11", `any.example.org. 300 IN TXT "any"`}},
		"sub.example.org. A": {
			ns: []string{"sub.example.org. 300 IN NS ns.sub.example.org."},
			ex: []string{"ns.sub.example.org. 300 IN A 192.0.2.54"},
		},
		"shortsub.example.org. A": {
			ns: []string{"shortsub.example.org. 2 IN NS ns.shortsub.example.org."},
			ex: []string{"ns.shortsub.example.org. 1 IN A 192.0.2.55"},
		},
		"empty.example.org. A": {},
		"aa.example.org. A":    {aa: true, an: []string{"aa.example.org. 300 IN A 192.0.2.3"}, ns: []string{"example.org. 300 IN NS ns.example.org."}, ex: []string{"ns.example.org. 300 IN A 192.0.2.53"}},
		"a.example.net. A":     {an: []string{"a.example.net. 300 IN A 198.51.100.1"}},
		"example.org. MX": {
			an: []string{"example.org. 300 IN MX 10 mail.example.org.", "example.org. 300 IN MX 20 mx.example.net."},
			ex: []string{"mail.example.org. 300 IN A 192.0.2.25"},
		},
		"example.org. NS": {
			an: []string{"example.org. 300 IN NS ns.example.org.", "example.org. 300 IN NS ns2.example.org."},
			ex: []string{"ns.example.org. 300 IN A 192.0.2.53", "ns2.example.org. 300 IN AAAA 2001:db8::53"},
		},
		"www.example.org. A": {an: []string{
			"www.example.org. 300 IN CNAME web.example.org.",
			"web.example.org. 300 IN CNAME host.example.net.",
			"host.example.net. 60 IN A 192.0.2.9",
		}},
		"www.example.org. CNAME": {an: []string{"www.example.org. 300 IN CNAME web.example.org."}},
		"beside.example.org. A": {an: []string{
			"beside.example.org. 300 IN CNAME host.example.net.",
			"beside.example.org. 300 IN A 192.0.2.17",
		}},
		"twotargets.example.org. CNAME": {an: []string{
			"twotargets.example.org. 300 IN CNAME a.example.org.",
			"twotargets.example.org. 300 IN CNAME b.example.org.",
		}},
		"dangling.example.org. A": {an: []string{"dangling.example.org. 300 IN CNAME nowhere.example.net."}},
		"cnodata.example.org. A": {
			an: []string{"cnodata.example.org. 300 IN CNAME host2.example.org."},
			ns: []string{diffSOA},
		},
		"low.example.org. A": {an: []string{
			"low.example.org. 300 IN CNAME lowhost.example.org.",
			"lowhost.example.org. 2 IN A 192.0.2.4",
		}},
		"zero.example.org. A":  {an: []string{"zero.example.org. 0 IN A 192.0.2.5"}},
		"short.example.org. A": {an: []string{"short.example.org. 30 IN A 192.0.2.30"}},
		"pop.example.org. A":   {an: []string{"pop.example.org. 100 IN A 192.0.2.100"}},
		"nx.example.org. A":    {rcode: dns.RcodeNameError, ns: []string{diffSOA}},
		"nx.example.org. AAAA": {rcode: dns.RcodeNameError, ns: []string{diffSOA}},
		"short-nx.example.org. A": {rcode: dns.RcodeNameError, ns: []string{
			"example.org. 3 IN SOA ns.example.org. hostmaster.example.org. 1 7200 3600 1209600 3",
		}},
		"soamin.example.org. A": {rcode: dns.RcodeNameError, ns: []string{
			"example.org. 300 IN SOA ns.example.org. hostmaster.example.org. 1 7200 3600 1209600 30",
		}},
		"fail.example.org. A":   {rcode: dns.RcodeServerFailure},
		"ede.example.org. A":    {rcode: dns.RcodeServerFailure, ede: dns.ExtendedErrorCodeNoReachableAuthority},
		"failrr.example.org. A": {rcode: dns.RcodeServerFailure, an: []string{"failrr.example.org. 2 IN A 192.0.2.18"}},
		"down.example.org. A":   {fail: true},
		"notimp.example.org. A": {rcode: dns.RcodeNotImplemented},
		"s.example.org. A":      {signed: true, an: []string{"s.example.org. 300 IN A 192.0.2.8"}},
		"s2.example.org. A":     {signed: true, an: []string{"s2.example.org. 300 IN A 192.0.2.15"}},
		"u.example.org. A":      {an: []string{"u.example.org. 300 IN A 192.0.2.16"}},
		"sany.example.org. ANY": {signed: true, an: []string{"sany.example.org. 300 IN A 192.0.2.19", `sany.example.org. 300 IN TXT "any"`}},
		"s.example.org. RRSIG": {signed: true, an: []string{
			"s.example.org. 300 IN RRSIG A 13 3 300 20270214080000 20270114080000 12345 example.org. c2lnbmF0dXJlLW9mLWE=",
		}},
		"snx.example.org. A": {signed: true, rcode: dns.RcodeNameError, ns: []string{
			diffSOA,
			"s.example.org. 60 IN NSEC t.example.org. A RRSIG NSEC",
		}},
		"zero-nx.example.org. A": {rcode: dns.RcodeNameError, ns: []string{
			"example.org. 0 IN SOA ns.example.org. hostmaster.example.org. 1 7200 3600 1209600 0",
		}},
		"topbit.example.org. A": {an: []string{"topbit.example.org. 2147483648 IN A 192.0.2.12"}},
		"spoof.example.org. A":  {question: "other.example.org.", an: []string{"other.example.org. 300 IN A 192.0.2.13"}},
		"cnx.example.org. A": {
			rcode: dns.RcodeNameError,
			an:    []string{"cnx.example.org. 300 IN CNAME gone.example.org."},
			ns:    []string{diffSOA},
		},
		"old.example.org. A":   {signed: true, expired: true, an: []string{"old.example.org. 300 IN A 192.0.2.14"}},
		"tc.example.org. A":    {tc: true, an: []string{"tc.example.org. 300 IN A 192.0.2.10"}},
		"big.example.org. TXT": {an: big},
		"glue.example.org. NS": {an: []string{"glue.example.org. 300 IN NS ns.glue.example.org."}, ex: glue},
	}
}

// diffClock is the fake clock both caches read. Background refreshes read
// it too, hence the atomic.
type diffClock struct{ ns atomic.Int64 }

func (c *diffClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *diffClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// diffUpstream answers from a script and counts the queries it gets.
type diffUpstream struct {
	clock *diffClock

	mu      sync.Mutex
	script  map[string]diffAnswer
	held    map[string]bool
	gate    chan struct{}
	queries int
	blocked int // queries waiting at the gate
	stuck   int // queries that waited at the gate until they gave up
}

func (u *diffUpstream) Name() string { return "diffupstream" }

func (u *diffUpstream) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	q := r.Question[0]
	k := qkey(q.Name, q.Qtype)
	u.mu.Lock()
	u.queries++
	a, ok := u.script[k]
	hold, gate := u.held[k], u.gate
	if hold {
		u.blocked++
	}
	u.mu.Unlock()
	if hold {
		// A query that a step makes wait for nothing (a miss, say) must
		// not hang the test: it gives up and says so.
		timeout := time.NewTimer(5 * time.Second)
		defer timeout.Stop()
		select {
		case <-gate:
		case <-ctx.Done():
		case <-timeout.C:
			u.mu.Lock()
			u.stuck++
			u.mu.Unlock()
		}
		u.mu.Lock()
		u.blocked--
		u.mu.Unlock()
	}
	if !ok {
		return dns.RcodeServerFailure, fmt.Errorf("diffupstream: nothing scripted for %s", k)
	}
	if a.fail {
		return dns.RcodeServerFailure, errors.New("diffupstream: timed out")
	}
	return dns.RcodeSuccess, w.WriteMsg(a.reply(r, isUDP(w), u.clock.now()))
}

// reply is the upstream's reply to r.
func (a diffAnswer) reply(r *dns.Msg, udp bool, now time.Time) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(r, a.rcode)
	if a.question != "" {
		m.Question[0].Name = a.question
	}
	m.Authoritative = a.aa
	m.RecursionAvailable = true
	o := r.IsEdns0()
	do := o != nil && o.Do()
	if a.tc && udp {
		m.Truncated = true
	} else {
		qtype := r.Question[0].Qtype
		// An ANY answer keeps its DNSSEC records for DO=0 queries too (RFC
		// 3225 3), as Unbound answers it.
		m.Answer = a.section(a.an, qtype, do || qtype == dns.TypeANY, now)
		m.Ns = a.section(a.ns, qtype, do, now)
		m.Extra = a.section(a.ex, qtype, do, now)
		m.AuthenticatedData = a.signed && (r.AuthenticatedData || do)
	}
	if o != nil {
		m.SetEdns0(o.UDPSize(), do)
		if a.ede != 0 {
			opt := m.IsEdns0()
			opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: a.ede, ExtraText: "scripted"})
		}
	}
	return m
}

// section parses rrs; DNSSEC records only for DO queries or when asked for
// (RFC 4035 3.2.1), and for signed answers an RRSIG after each RRset.
func (a diffAnswer) section(rrs []string, qtype uint16, do bool, now time.Time) []dns.RR {
	var out []dns.RR
	for i, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			panic(fmt.Sprintf("diffZone: %q: %v", s, err))
		}
		h := rr.Header()
		if (h.Rrtype == dns.TypeRRSIG || h.Rrtype == dns.TypeNSEC || h.Rrtype == dns.TypeNSEC3) && h.Rrtype != qtype && !do {
			continue
		}
		out = append(out, rr)
		last := i == len(rrs)-1
		if !last {
			next, _ := dns.NewRR(rrs[i+1])
			last = next.Header().Rrtype != h.Rrtype || !strings.EqualFold(next.Header().Name, h.Name)
		}
		if a.signed && do && last && h.Rrtype != dns.TypeRRSIG {
			expiration := now.Add(30 * 24 * time.Hour)
			if a.expired {
				expiration = now.Add(-24 * time.Hour)
			}
			out = append(out, &dns.RRSIG{
				Hdr:         dns.RR_Header{Name: h.Name, Rrtype: dns.TypeRRSIG, Class: dns.ClassINET, Ttl: h.Ttl},
				TypeCovered: h.Rrtype, Algorithm: dns.ECDSAP256SHA256, Labels: uint8(dns.CountLabel(h.Name)),
				OrigTtl: h.Ttl, Expiration: uint32(expiration.Unix()),
				Inception: uint32(now.Add(-48 * time.Hour).Unix()), KeyTag: 12345, SignerName: "example.org.",
				Signature: "c2lnbmF0dXJlLW9mLWE=",
			})
		}
	}
	return out
}

// diffView is what one step showed: the client's reply and the upstream's
// queries during the step.
type diffView struct {
	msg    *dns.Msg // nil when nothing was written
	writes int
	up     int
}

func (v *diffView) copy() *diffView {
	c := *v
	if v.msg != nil {
		c.msg = v.msg.Copy()
	}
	return &c
}

// String renders v as the client sees it; owners and TTLs as they are.
func (v *diffView) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "writes %d, upstream queries %d\n", v.writes, v.up)
	m := v.msg
	if m == nil {
		return b.String()
	}
	fmt.Fprintf(&b, "%s %s id=%d", dns.OpcodeToString[m.Opcode], dns.RcodeToString[m.Rcode], m.Id)
	for _, f := range []struct {
		on   bool
		name string
	}{{m.Response, "qr"}, {m.Authoritative, "aa"}, {m.Truncated, "tc"}, {m.RecursionDesired, "rd"},
		{m.RecursionAvailable, "ra"}, {m.Zero, "z"}, {m.AuthenticatedData, "ad"}, {m.CheckingDisabled, "cd"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	b.WriteString("\n")
	for _, q := range m.Question {
		fmt.Fprintf(&b, "question %s\n", q.String())
	}
	for i, rrs := range [3][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range rrs {
			if o, ok := rr.(*dns.OPT); ok {
				fmt.Fprintf(&b, "opt version=%d udp=%d do=%v ext-rcode=%d", o.Version(), o.UDPSize(), o.Do(), o.ExtendedRcode())
				for _, e := range o.Option {
					fmt.Fprintf(&b, " option[%d]=%s", e.Option(), e.String())
				}
				b.WriteString("\n")
				continue
			}
			fmt.Fprintf(&b, "%s %s\n", [3]string{"an", "ns", "ex"}[i], rr.String())
		}
	}
	return b.String()
}

// checkStep compares the stock cache's and compactcache's views of a step.
func checkStep(t *testing.T, where string, st diffStep, stock, compact *diffView) {
	t.Helper()
	for _, r := range st.diff {
		if _, ok := diffReasons[r]; !ok {
			t.Fatalf("%s: unknown reason %q", where, r)
		}
	}
	erased := func(skip string) (string, string) {
		s, c := stock.copy(), compact.copy()
		for _, r := range st.diff {
			if r != skip {
				diffReasons[r].erase(s, c)
			}
		}
		return s.String(), c.String()
	}
	s, c := erased("")
	if st.bug != "" {
		if s == c {
			t.Errorf("%s: bug %q no longer shows: delete the step's bug mark", where, st.bug)
		} else {
			t.Errorf("%s: BUG %s (%s):\nstock cache:\n%scompactcache:\n%s", where, st.bug, diffBugs[st.bug], s, c)
		}
		return
	}
	if s != c {
		t.Errorf("%s: unlisted difference (listed: %v)\nstock cache:\n%scompactcache:\n%s", where, st.diff, s, c)
		return
	}
	for _, r := range st.diff {
		if s, c := erased(r); s == c {
			t.Errorf("%s: the step lists %q but shows no such difference", where, r)
		}
	}
}

// runScenario runs sc against the directive's plugin and returns the view of
// each step.
func runScenario(t *testing.T, sc diffScenario, directive string, raw bool, baseline map[string]bool) []*diffView {
	t.Helper()
	clk := &diffClock{}
	clk.ns.Store(1_800_000_000 * int64(time.Second))
	u := &diffUpstream{clock: clk, script: map[string]diffAnswer{}, held: map[string]bool{}}
	for k, a := range diffZone() {
		u.script[diffKey(k)] = a
	}
	h := diffBuild(t, directive, sc.corefile, u, clk.now)
	if c, ok := h.(*Cache); ok {
		c.SetRawWrites(raw)
		defer c.refreshes.shutdown(5 * time.Second)
	}
	views := make([]*diffView, len(sc.steps))
	for i, st := range sc.steps {
		clk.advance(st.advance)
		if st.set != "" {
			u.mu.Lock()
			u.script[diffKey(st.set)] = st.to
			u.mu.Unlock()
		}
		if st.hold != "" {
			u.mu.Lock()
			u.held[diffKey(st.hold)] = true
			u.gate = make(chan struct{})
			u.mu.Unlock()
		}
		if st.release {
			u.mu.Lock()
			clear(u.held)
			close(u.gate)
			u.mu.Unlock()
		}
		before := u.count()
		if st.ask != "" {
			req, tcp := diffRequest(t, st.ask, uint16(i+1))
			views[i] = diffServe(h, req, tcp)
		}
		quiesce(t, fmt.Sprintf("%s: %s step %d", sc.name, directive, i), u, baseline)
		if views[i] != nil {
			views[i].up = u.count() - before
		}
		u.mu.Lock()
		stuck := u.stuck
		u.mu.Unlock()
		if stuck > 0 {
			t.Fatalf("%s: %s step %d: a query waited at the upstream's gate with no release to come", sc.name, directive, i)
		}
	}
	return views
}

func (u *diffUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.queries
}

// diffKey turns "name type" into the upstream's script key.
func diffKey(s string) string {
	f := strings.Fields(s)
	t, ok := dns.StringToType[f[1]]
	if len(f) != 2 || !ok {
		panic(fmt.Sprintf("diffKey: %q is not \"name type\"", s))
	}
	return qkey(f[0], t)
}

// diffBuild sets up the directive's plugin from Corefile text with its
// registered setup function, as CoreDNS does for a server block, in front of
// next, and makes it read now.
func diffBuild(t *testing.T, directive, corefile string, next plugin.Handler, now func() time.Time) plugin.Handler {
	t.Helper()
	setup, err := caddy.DirectiveAction("dns", directive)
	if err != nil {
		t.Fatal(err)
	}
	ctrl := caddy.NewTestController("dns", directive+" "+corefile)
	ctrl.ServerBlockKeys = []string{"."}
	if err := setup(ctrl); err != nil {
		t.Fatalf("%s %s: %v", directive, corefile, err)
	}
	cfg := dnsserver.GetConfig(ctrl)
	if len(cfg.Plugin) != 1 {
		t.Fatalf("%s: setup added %d plugins, want 1", directive, len(cfg.Plugin))
	}
	h := cfg.Plugin[0](next)
	switch c := h.(type) {
	case *Cache:
		c.now = now
	default:
		if typ := fmt.Sprintf("%T", h); typ != "*cache.Cache" {
			t.Fatalf("%s: setup made a %s", directive, typ)
		}
		// The stock cache reads the time through its unexported field
		// `now func() time.Time`. Its own tests set the field from inside
		// package cache; it has no option or setter for it. Both caches must
		// read the same fake clock, so that TTL aging, expiry, the serve_stale
		// window, failure rechecks and prefetch popularity are compared at the
		// same instants without sleeping through real TTLs. reflect refuses
		// to set an unexported field through FieldByName's Value, so
		// reflect.NewAt makes a settable Value of the same type at the
		// field's address. The test fails above if the field is gone or its
		// type changes, rather than writing through a wrong pointer.
		f := reflect.ValueOf(h).Elem().FieldByName("now")
		if !f.IsValid() || f.Type() != reflect.TypeOf(now) {
			t.Fatalf("the stock cache has no field now of type %T", now)
		}
		reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(now))
	}
	return h
}

// diffRequest builds the query ask describes, with id.
func diffRequest(t *testing.T, ask string, id uint16) (*dns.Msg, bool) {
	f := strings.Fields(ask)
	if len(f) < 2 {
		t.Fatalf("ask %q: want name and type", ask)
	}
	qtype, ok := dns.StringToType[f[1]]
	if !ok {
		t.Fatalf("ask %q: unknown type %q", ask, f[1])
	}
	m := new(dns.Msg)
	m.SetQuestion(f[0], qtype)
	m.Id = id
	var do, noEDNS, tcp bool
	var opts []dns.EDNS0
	size := uint16(1232)
	for _, flag := range f[2:] {
		switch {
		case flag == "+do":
			do = true
		case flag == "+cd":
			m.CheckingDisabled = true
		case flag == "+ad":
			m.AuthenticatedData = true
		case flag == "-edns":
			noEDNS = true
		case flag == "tcp":
			tcp = true
		case flag == "opt":
			opts = append(opts, &dns.EDNS0_LOCAL{Code: diffOption, Data: []byte("local")})
		case flag == "badecs": // host bits past the source prefix (RFC 7871 6)
			opts = append(opts, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 1)})
		case flag == "2q":
			m.Question = append(m.Question, dns.Question{Name: "u.example.org.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		case strings.HasPrefix(flag, "bufsize="):
			n, err := strconv.ParseUint(strings.TrimPrefix(flag, "bufsize="), 10, 16)
			if err != nil {
				t.Fatalf("ask %q: %v", ask, err)
			}
			size = uint16(n)
		default:
			t.Fatalf("ask %q: unknown flag %q", ask, flag)
		}
	}
	if !noEDNS {
		m.SetEdns0(size, do)
		m.IsEdns0().Option = opts
	}
	return m, tcp
}

// diffServe hands req to h as dnsserver.Server.ServeDNS does: through a
// ScrubWriter, and with the server's own error reply when the plugin returns
// an rcode it did not write.
func diffServe(h plugin.Handler, req *dns.Msg, tcp bool) *diffView {
	rec := &recorder{ResponseWriter: test.ResponseWriter{TCP: tcp}}
	r := req.Copy()
	w := request.NewScrubWriter(r, rec)
	rcode, _ := h.ServeDNS(context.Background(), w, r)
	if !plugin.ClientWrite(rcode) {
		answer := new(dns.Msg)
		answer.SetRcode(r, rcode)
		state := request.Request{W: w, Req: r}
		state.SizeAndDo(answer)
		w.WriteMsg(answer)
	}
	return &diffView{msg: rec.msg, writes: rec.writes}
}

// The goroutines the caches start for background fetches: prefetch and
// serve_stale refreshes, and verify fetches that outlive their timeout.
var diffBackground = []string{
	"created by github.com/coredns/coredns/plugin/cache.(*Cache).tryPrefetch",
	"created by github.com/coredns/coredns/plugin/cache.(*Cache).verifyWithTimeout",
	"created by github.com/compactcache/compactcache.(*Cache).detach",
}

// backgroundGoroutines returns the background fetches running, by goroutine
// header, leaving out those in ignore.
func backgroundGoroutines(ignore map[string]bool) map[string]bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	running := map[string]bool{}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		id, _, _ := strings.Cut(g, " [")
		if ignore[id] {
			continue
		}
		if slices.ContainsFunc(diffBackground, func(m string) bool { return strings.Contains(g, m) }) {
			running[id] = true
		}
	}
	return running
}

// quiesce waits until the background fetches started by the step have
// finished, or wait at the gate of an upstream that holds them: a cache's
// background work is done when its goroutine ends, after it stored what it
// fetched and recorded the refresh's outcome, which the upstream's query
// count alone does not tell. It polls with a deadline; it never relies on a
// fixed sleep.
func quiesce(t *testing.T, what string, u *diffUpstream, baseline map[string]bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for pause := 50 * time.Microsecond; ; pause = min(2*pause, 5*time.Millisecond) {
		running := len(backgroundGoroutines(baseline))
		u.mu.Lock()
		blocked, holding := u.blocked, len(u.held) > 0
		u.mu.Unlock()
		// While the upstream holds, the step is done when every background
		// fetch waits at the gate; once it let go, when none is left.
		if running == blocked && (holding || blocked == 0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d background fetches still running, %d held by the upstream", what, running, blocked)
		}
		time.Sleep(pause)
	}
}

// Erasers: each removes one intended effect from the two views.

func diffAll(fs ...func(st, cc *diffView)) func(st, cc *diffView) {
	return func(st, cc *diffView) {
		for _, f := range fs {
			f(st, cc)
		}
	}
}

// eraseEDE drops compactcache's EDE option with code.
func eraseEDE(code uint16) func(st, cc *diffView) {
	return func(_, cc *diffView) {
		if cc.msg == nil {
			return
		}
		if o := cc.msg.IsEdns0(); o != nil {
			o.Option = slices.DeleteFunc(o.Option, func(e dns.EDNS0) bool {
				ede, ok := e.(*dns.EDNS0_EDE)
				return ok && ede.InfoCode == code
			})
		}
	}
}

// pairRecords calls f with the TTLs of the records at the same places in
// both replies, OPT aside, when their sections are as long.
func pairRecords(st, cc *diffView, f func(s, c *dns.RR_Header)) {
	if st.msg == nil || cc.msg == nil {
		return
	}
	ss := [3][]dns.RR{st.msg.Answer, st.msg.Ns, st.msg.Extra}
	cs := [3][]dns.RR{cc.msg.Answer, cc.msg.Ns, cc.msg.Extra}
	for i := range ss {
		if len(ss[i]) != len(cs[i]) {
			continue
		}
		for j := range ss[i] {
			if ss[i][j].Header().Rrtype != dns.TypeOPT && cs[i][j].Header().Rrtype != dns.TypeOPT {
				f(ss[i][j].Header(), cs[i][j].Header())
			}
		}
	}
}

// eraseStaleTTL: compactcache's stale TTL of 30s where the stock's is other.
func eraseStaleTTL(st, cc *diffView) {
	pairRecords(st, cc, func(s, c *dns.RR_Header) {
		if c.Ttl == uint32(config.DefaultStaleTTL/time.Second) {
			c.Ttl = s.Ttl
		}
	})
}

// eraseLowerTTL: compactcache's TTLs below the stock's.
func eraseLowerTTL(st, cc *diffView) {
	pairRecords(st, cc, func(s, c *dns.RR_Header) {
		if c.Ttl < s.Ttl {
			c.Ttl = s.Ttl
		}
	})
}

// eraseTTLs: all TTLs.
func eraseTTLs(st, cc *diffView) {
	pairRecords(st, cc, func(s, c *dns.RR_Header) { s.Ttl, c.Ttl = 0, 0 })
}

// eraseQueries: the upstream's query counts.
func eraseQueries(st, cc *diffView) { cc.up = st.up }

// eraseOwnerCase: the case of owner names.
func eraseOwnerCase(st, cc *diffView) {
	for _, v := range []*diffView{st, cc} {
		if v.msg == nil {
			continue
		}
		for _, rrs := range [][]dns.RR{v.msg.Answer, v.msg.Ns, v.msg.Extra} {
			for _, rr := range rrs {
				rr.Header().Name = strings.ToLower(rr.Header().Name)
			}
		}
	}
}

// eraseForeign: compactcache's SERVFAIL where the stock cache passed on a
// reply to another question.
func eraseForeign(st, cc *diffView) {
	if st.msg == nil || cc.msg == nil || cc.msg.Rcode != dns.RcodeServerFailure || len(cc.msg.Answer) != 0 ||
		len(st.msg.Question) == 1 && len(cc.msg.Question) == 1 && strings.EqualFold(st.msg.Question[0].Name, cc.msg.Question[0].Name) {
		return
	}
	cc.msg = st.msg.Copy()
}

// eraseNonAnswer: compactcache's stale entry where the stock cache passed on
// a NOERROR whose answer holds no record of the question's name, and no SOA.
func eraseNonAnswer(st, cc *diffView) {
	if st.msg == nil || cc.msg == nil || st.msg.Rcode != dns.RcodeSuccess || len(st.msg.Answer) == 0 || len(st.msg.Question) != 1 {
		return
	}
	for _, rr := range slices.Concat(st.msg.Answer, st.msg.Ns) {
		if strings.EqualFold(rr.Header().Name, st.msg.Question[0].Name) || rr.Header().Rrtype == dns.TypeSOA {
			return
		}
	}
	cc.msg = st.msg.Copy()
}

// eraseTCPRetry: the upstream's queries, and the stock cache's truncated
// reply against compactcache's whole one, fetched again over TCP.
func eraseTCPRetry(st, cc *diffView) {
	cc.up = st.up
	if st.msg == nil || cc.msg == nil || !st.msg.Truncated || cc.msg.Truncated {
		return
	}
	cc.msg.Truncated = true
	cc.msg.Answer, cc.msg.Ns = st.msg.Answer, st.msg.Ns
}

// eraseTruncation: in two truncated replies, the records of the stock
// cache's past compactcache's, when those are the first of the stock's; and
// the stock's TC where it left out additional records only.
func eraseTruncation(st, cc *diffView) {
	if st.msg == nil || cc.msg == nil || !st.msg.Truncated {
		return
	}
	if len(st.msg.Answer) == len(cc.msg.Answer) && len(st.msg.Ns) == len(cc.msg.Ns) {
		cc.msg.Truncated = true
	}
	if !cc.msg.Truncated {
		return
	}
	s := [3]*[]dns.RR{&st.msg.Answer, &st.msg.Ns, &st.msg.Extra}
	c := [3][]dns.RR{cc.msg.Answer, cc.msg.Ns, cc.msg.Extra}
	var cut [3][]dns.RR
	for i := range s {
		var opt []dns.RR
		ss, cs := withoutOPT(*s[i], &opt), withoutOPT(c[i], nil)
		if len(cs) > len(ss) {
			return
		}
		for j := range cs {
			if !dns.IsDuplicate(cs[j], ss[j]) {
				return
			}
		}
		cut[i] = append(ss[:len(cs):len(cs)], opt...)
	}
	for i := range s {
		*s[i] = cut[i]
	}
}

// withoutOPT returns rrs without OPT records, which it appends to opt.
func withoutOPT(rrs []dns.RR, opt *[]dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		} else if opt != nil {
			*opt = append(*opt, rr)
		}
	}
	return out
}
