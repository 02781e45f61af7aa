package compactcache

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/persist"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/caddy"
)

func mustParse(t *testing.T, corefile string) *Cache {
	t.Helper()
	ctrl := caddy.NewTestController("dns", corefile)
	ctrl.ServerBlockKeys = []string{"."}
	c, err := parse(ctrl)
	if err != nil {
		t.Fatalf("%q: %v", corefile, err)
	}
	return c
}

// sameShape reports whether s has the shape of a store of its budget, no
// entry caps and a serve_stale window of grace seconds.
func sameShape(s *store.Store, grace int64) bool {
	o, err := store.New(s.Capacity(), store.PerKind{}, grace)
	return err == nil && s.SameShape(o)
}

func TestParse(t *testing.T) {
	tests := []struct {
		input string
		check func(*Cache) bool
	}{
		{`compactcache`, func(c *Cache) bool {
			return c.Capacity == config.DefaultCapacity && c.SuccessCap == 0 && c.DenialCap == 0 && c.SuccessTTL == config.MaxTTL && c.DenialTTL == config.MaxDenialTTL &&
				c.SuccessMinTTL == config.MinDefaultTTL && c.ServfailTTL == config.ServfailTTL && !c.KeepTTL
		}},
		{`compactcache 300`, func(c *Cache) bool { return c.SuccessTTL == 300*time.Second && c.DenialTTL == 300*time.Second }},
		{`compactcache 300 example.org example.net`, func(c *Cache) bool {
			return strings.Join(c.Zones, ",") == "example.org.,example.net."
		}},
		{`compactcache example.org`, func(c *Cache) bool { return c.Zones[0] == "example.org." && c.SuccessTTL == config.MaxTTL }},
		{"compactcache {\n capacity 256MiB\n}", func(c *Cache) bool { return c.store.Capacity() == 256<<20 }},
		{"compactcache {\n capacity 1G\n}", func(c *Cache) bool { return c.store.Capacity() == 1<<30 }},
		{"compactcache {\n capacity 2048K\n}", func(c *Cache) bool { return c.store.Capacity() == 2<<20 }},
		{"compactcache {\n capacity 1048576\n}", func(c *Cache) bool { return c.store.Capacity() == 1<<20 }},
		{"compactcache {\n success 9984 600 10\n denial 2000 60\n}", func(c *Cache) bool {
			return c.SuccessCap == 9984 && c.SuccessTTL == 600*time.Second && c.SuccessMinTTL == 10*time.Second &&
				c.DenialCap == 2000 && c.DenialTTL == 60*time.Second && c.DenialMinTTL == config.MinDefaultTTL
		}},
		// A cap under the stock cache's smallest, 1024, keeps 1024 as there.
		{"compactcache {\n success 100\n denial 1\n}", func(c *Cache) bool { return c.SuccessCap == 1024 && c.DenialCap == 1024 }},
		{"compactcache {\n success 1023\n denial 1025\n}", func(c *Cache) bool { return c.SuccessCap == 1024 && c.DenialCap == 1025 }},
		{"compactcache {\n success 0 600 0\n}", func(c *Cache) bool { return c.SuccessCap == 0 && c.SuccessMinTTL == 0 }},
		{"compactcache {\n servfail 0s\n}", func(c *Cache) bool { return c.ServfailTTL == 0 }},
		{"compactcache {\n servfail 30s\n}", func(c *Cache) bool { return c.ServfailTTL == 30*time.Second }},
		{"compactcache {\n keepttl\n}", func(c *Cache) bool { return c.KeepTTL }},
		{"compactcache {\n prefetch 10\n}", func(c *Cache) bool {
			return c.Prefetch == 10 && c.PrefetchWindow == time.Minute && c.PrefetchPercentage == 10
		}},
		{"compactcache {\n prefetch 2 30s\n}", func(c *Cache) bool { return c.Prefetch == 2 && c.PrefetchWindow == 30*time.Second }},
		{"compactcache {\n prefetch 2 30s 50%\n}", func(c *Cache) bool { return c.PrefetchPercentage == 50 }},
		{"compactcache {\n prefetch 2 20%\n}", func(c *Cache) bool { return c.PrefetchPercentage == 20 && c.PrefetchWindow == time.Minute }},
		// Hits are kept in seconds: a shorter window is one second.
		{"compactcache {\n prefetch 2 500ms\n}", func(c *Cache) bool { return c.PrefetchWindow == time.Second }},
		{"compactcache 2147483647", func(c *Cache) bool { return c.SuccessTTL == math.MaxInt32*time.Second }},
		{"compactcache {\n serve_stale\n}", func(c *Cache) bool {
			return c.StaleUpTo == time.Hour && !c.VerifyStale && c.StaleTTL == config.DefaultStaleTTL && c.FailRecheck == config.DefaultFailRecheck &&
				sameShape(c.store, 3600)
		}},
		{"compactcache {\n serve_stale 10m\n}", func(c *Cache) bool { return c.StaleUpTo == 10*time.Minute }},
		{"compactcache {\n serve_stale 1h immediate 0s 0s\n}", func(c *Cache) bool {
			return c.StaleTTL == 0 && c.FailRecheck == 0 && !c.VerifyStale
		}},
		{"compactcache {\n serve_stale 1h verify\n}", func(c *Cache) bool { return c.VerifyStale && c.VerifyTimeout == 0 }},
		{"compactcache {\n serve_stale 1h VERIFY 100ms 10s 1m\n}", func(c *Cache) bool {
			return c.VerifyStale && c.VerifyTimeout == 100*time.Millisecond && c.StaleTTL == 10*time.Second && c.FailRecheck == time.Minute
		}},
		{"compactcache {\n serve_stale\n serve_stale_policy prefer_positive\n}", func(c *Cache) bool { return c.PreferPositive }},
		{"compactcache {\n disable success\n}", func(c *Cache) bool { return strings.Join(c.DisableSuccess, ",") == "." }},
		{"compactcache", func(c *Cache) bool { return c.ecs == ecsConfig{config.Defaults().ECS} }},
		{"compactcache {\n ecs 16 48\n}", func(c *Cache) bool {
			return c.ecs == ecsConfig{config.ECS{Source4: 16, Source6: 48, MaxVariants: config.DefaultMaxVariants}}
		}},
		{"compactcache {\n ecs {\n add\n max_variants 10\n }\n keepttl\n}", func(c *Cache) bool {
			return c.ecs == ecsConfig{config.ECS{Source4: 24, Source6: 56, Add: true, MaxVariants: 10}} && c.KeepTTL
		}},
		// The option's own syntax is internal/frontend's TestParse.
		{"compactcache {\n frontend 127.0.0.1:53 {\n sockets 4\n }\n keepttl\n}", func(c *Cache) bool { return c.Frontend != nil && c.KeepTTL }},
		{"compactcache", func(c *Cache) bool { return c.Frontend == nil && c.Snapshot == nil }},
		{"compactcache {\n snapshot /var/lib/coredns/cache.snap 5m\n}", func(c *Cache) bool {
			want, err := persist.ParseSnapshot([]string{"/var/lib/coredns/cache.snap", "5m"})
			return err == nil && *c.Snapshot == *want
		}},
		{"compactcache {\n disable denial example.org Example.NET.\n}", func(c *Cache) bool {
			return strings.Join(c.DisableDenial, ",") == "example.org.,example.net."
		}},
		// Edge values of the stock cache's lines, parsed as it parses them.
		{"compactcache 1", func(c *Cache) bool { return c.SuccessTTL == time.Second && c.SuccessMinTTL == config.MinDefaultTTL }},
		{"compactcache example.org 300", func(c *Cache) bool {
			return strings.Join(c.Zones, ",") == "example.org.,300." && c.SuccessTTL == config.MaxTTL
		}},
		{"compactcache 99999999999999999999", func(c *Cache) bool { return c.Zones[0] == "99999999999999999999." && c.SuccessTTL == config.MaxTTL }},
		{"compactcache 10.0.0.0/8", func(c *Cache) bool { return strings.Join(c.Zones, ",") == "10.in-addr.arpa." }},
		{"compactcache {\n success 2000 60 120\n}", func(c *Cache) bool { return c.SuccessTTL == time.Minute && c.SuccessMinTTL == 2*time.Minute }},
		{"compactcache {\n success 2000 600\n success 1500\n}", func(c *Cache) bool { return c.SuccessCap == 1500 && c.SuccessTTL == 600*time.Second }},
		{"compactcache 600 {\n denial 2000\n}", func(c *Cache) bool { return c.DenialTTL == 600*time.Second && c.SuccessTTL == 600*time.Second }},
		{"compactcache {\n prefetch 0\n}", func(c *Cache) bool { return c.Prefetch == 0 }},
		{"compactcache {\n prefetch 10 1m 90%\n}", func(c *Cache) bool { return c.PrefetchPercentage == 90 }},
		{"compactcache {\n prefetch 10 30s 50%\n prefetch 5\n}", func(c *Cache) bool {
			return c.Prefetch == 5 && c.PrefetchWindow == 30*time.Second && c.PrefetchPercentage == 50
		}},
		{"compactcache {\n serve_stale 0\n}", func(c *Cache) bool { return c.StaleUpTo == 0 }},
		{"compactcache {\n serve_stale 2h verify 100ms 10s 1m\n serve_stale 1h\n}", func(c *Cache) bool {
			return c.StaleUpTo == time.Hour && !c.VerifyStale && c.VerifyTimeout == 0 && c.StaleTTL == config.DefaultStaleTTL && c.FailRecheck == config.DefaultFailRecheck
		}},
		{"compactcache {\n serve_stale 1h verify 0 30s\n}", func(c *Cache) bool { return c.VerifyStale && c.VerifyTimeout == 0 && c.StaleTTL == 30*time.Second }},
		{"compactcache {\n serve_stale 1h immediate 0\n}", func(c *Cache) bool { return c.StaleTTL == 0 }},
		{"compactcache {\n serve_stale_policy PREFER_POSITIVE\n serve_stale\n}", func(c *Cache) bool { return c.PreferPositive }},
		{"compactcache {\n servfail 5m\n}", func(c *Cache) bool { return c.ServfailTTL == 5*time.Minute }},
		{"compactcache {\n servfail 500ms\n}", func(c *Cache) bool { return c.ServfailTTL == 500*time.Millisecond }},
		{"compactcache {\n disable success example.org\n disable success\n}", func(c *Cache) bool { return strings.Join(c.DisableSuccess, ",") == "." }},
	}
	for _, tc := range tests {
		c, err := parse(caddy.NewTestController("dns", tc.input))
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if !tc.check(c) {
			t.Errorf("%q: parsed to %+v", tc.input, c)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		input string
		want  string // the error names the option and the value
	}{
		{`compactcache 0`, `TTL: "0"`},
		{`compactcache -5`, `TTL: "-5"`},
		{`compactcache 18446744073`, `TTL: "18446744073" is not a number of seconds between 1 and 2147483647`},
		{"compactcache {\n success 10 2147483648\n}", `success TTL: "2147483648"`},
		{"compactcache {\n capacity\n}", "capacity: want one SIZE"},
		{"compactcache {\n capacity 64XB\n}", `capacity: "64XB"`},
		{"compactcache {\n capacity 0\n}", `capacity: "0"`},
		{"compactcache {\n capacity 512K\n}", "capacity: 524288 bytes is outside"},
		{"compactcache {\n capacity 9999999G\n}", `capacity: "9999999G"`},
		{"compactcache {\n capacity 1024G\n}", `capacity: "1024G" is above the largest budget, 512GiB`},
		{"compactcache {\n capacity 1MiB 2MiB\n}", "capacity: want one SIZE, got 2"},
		{"compactcache {\n success\n}", "success: want CAPACITY"},
		{"compactcache {\n success many\n}", `success: CAPACITY "many"`},
		{"compactcache {\n success -1\n}", `success: CAPACITY "-1"`},
		{"compactcache {\n success 10 0\n}", `success TTL: "0"`},
		{"compactcache {\n success 10 60 -1\n}", `success MINTTL: "-1"`},
		{"compactcache {\n success 10 60 5 1\n}", "success: want CAPACITY [TTL [MINTTL]], got 4"},
		{"compactcache {\n denial 10 x\n}", `denial TTL: "x"`},
		{"compactcache {\n servfail\n}", "servfail: want one DURATION"},
		{"compactcache {\n servfail 10\n}", `servfail: "10"`},
		{"compactcache {\n servfail 6m\n}", `servfail: "6m"`},
		{"compactcache {\n keepttl yes\n}", "keepttl: takes no arguments"},
		{"compactcache {\n bogus\n}", `unknown option "bogus"`},
		{"compactcache {\n capacity 1M\n capacity 2M\n}", "capacity: can only be given once"},
		{"compactcache {\n prefetch\n}", "prefetch: want AMOUNT"},
		{"compactcache {\n prefetch x\n}", `prefetch: AMOUNT "x"`},
		{"compactcache {\n prefetch -1\n}", `prefetch: AMOUNT "-1"`},
		{"compactcache {\n prefetch 70000\n}", `prefetch: AMOUNT "70000"`},
		{"compactcache {\n prefetch 1 0s\n}", `prefetch: DURATION "0s"`},
		{"compactcache {\n prefetch 1 1m 5%\n}", `prefetch: PERCENTAGE "5%"`},
		{"compactcache {\n prefetch 1 1m 95%\n}", `prefetch: PERCENTAGE "95%"`},
		{"compactcache {\n prefetch 1 1m 50\n}", `prefetch: PERCENTAGE "50" needs its % sign`},
		{"compactcache {\n prefetch 1 1m 50% 1\n}", "prefetch: want AMOUNT [[DURATION] [PERCENTAGE%]], got 4"},
		{"compactcache {\n prefetch 10 1m 1m\n}", `prefetch: PERCENTAGE "1m" needs its % sign`},
		{"compactcache {\n prefetch 10 50% 60%\n}", `prefetch: "60%" after PERCENTAGE "50%"`},
		{"compactcache {\n prefetch 10 50% 1m\n}", `prefetch: "1m" after PERCENTAGE "50%"`},
		{"compactcache {\n serve_stale 1h immediate 2147483648s\n}", `serve_stale: RESPONSE_TTL "2147483648s" is above the largest TTL`},
		{"compactcache {\n serve_stale -1h\n}", `serve_stale: DURATION "-1h"`},
		{"compactcache {\n serve_stale 1h later\n}", `serve_stale: mode "later"`},
		{"compactcache {\n serve_stale 1h immediate 1.5s\n}", `serve_stale: RESPONSE_TTL "1.5s"`},
		{"compactcache {\n serve_stale 1h immediate 30s 6m\n}", `serve_stale: FAILURE_RECHECK "6m"`},
		{"compactcache {\n serve_stale 1h immediate 30s 1m 1\n}", "serve_stale: immediate takes [RESPONSE_TTL [FAILURE_RECHECK]]"},
		{"compactcache {\n serve_stale 1h verify -1s\n}", `serve_stale: VERIFY_TIMEOUT "-1s"`},
		{"compactcache {\n serve_stale 1h verify 1s 1s 1s 1s\n}", "serve_stale: want at most 5 arguments"},
		{"compactcache {\n serve_stale_policy prefer_positive\n}", "serve_stale_policy: requires serve_stale"},
		{"compactcache {\n serve_stale\n serve_stale_policy newest\n}", `serve_stale_policy: want prefer_positive, got ["newest"]`},
		{"compactcache {\n serve_stale\n serve_stale_policy prefer_positive\n serve_stale_policy prefer_positive\n}", "serve_stale_policy: can only be given once"},
		{"compactcache {\n disable\n}", "disable: want success or denial"},
		{"compactcache {\n ecs 33\n}", `ecs: source prefix "33"`},
		{"compactcache {\n ecs 24 129\n}", `ecs: source prefix "129"`},
		{"compactcache {\n ecs 24 56 1\n}", "ecs: want [SOURCE4 [SOURCE6]], got 3"},
		{"compactcache {\n ecs {\n add 1\n }\n}", "ecs: add takes no arguments"},
		{"compactcache {\n ecs {\n max_variants 0\n }\n}", `ecs: max_variants wants one number between 1 and 1000, got ["0"]`},
		{"compactcache {\n ecs {\n nearest\n }\n}", `ecs: unknown option "nearest"`},
		{"compactcache {\n ecs\n ecs\n}", "ecs: can only be given once"},
		{"compactcache {\n disable both\n}", `disable: "both" is not success or denial`},
		{"compactcache {\n frontend\n}", "frontend: want at least one ADDRESS"},
		{"compactcache {\n frontend 127.0.0.1\n}", `frontend: "127.0.0.1" is not HOST:PORT`},
		{"compactcache {\n frontend tls://127.0.0.1:853\n}", `frontend: "tls://127.0.0.1:853": want dns://, udp:// or tcp://`},
		{"compactcache {\n frontend :53 {\n sockets 0\n }\n}", `frontend sockets: "0" is not a number of at least 1`},
		{"compactcache {\n frontend :53 {\n log -1\n }\n}", `frontend log: "-1" is not a number of at least 0`},
		{"compactcache {\n frontend :53 {\n inflight\n }\n}", "frontend inflight: want one number"},
		{"compactcache {\n frontend :53 {\n batch 8\n }\n}", `frontend: unknown option "batch"`},
		{"compactcache {\n frontend :53 {\n wait epoll\n }\n}", `frontend wait: want thread or poller, got ["epoll"]`},
		{"compactcache {\n frontend :53\n frontend :54\n}", "frontend: can only be given once"},
		{"compactcache {\n snapshot\n}", "snapshot: want PATH [INTERVAL]"},
		{"compactcache {\n snapshot cache.snap\n}", `snapshot: "cache.snap" is not an absolute path`},
		{"compactcache {\n snapshot /var/cache.snap 100ms\n}", `snapshot: INTERVAL "100ms" is not a duration of a second or more`},
		{"compactcache {\n snapshot /a 1m\n snapshot /b\n}", "snapshot: can only be given once"},
		{"compactcache\ncompactcache", "once per Server Block"},
		{"compactcache {\n success 100 60s\n}", `success TTL: "60s"`},
		{"compactcache {\n success 100 60 5s\n}", `success MINTTL: "5s"`},
		{"compactcache {\n prefetch 10 10\n}", `prefetch: DURATION "10"`},
		{"compactcache {\n prefetch 10 1m %\n}", `prefetch: PERCENTAGE "%"`},
		{"compactcache {\n serve_stale 10\n}", `serve_stale: DURATION "10"`},
		{"compactcache {\n serve_stale 1h immediate 30\n}", `serve_stale: RESPONSE_TTL "30"`},
		{"compactcache {\n serve_stale 1h immediate 30s -1s\n}", `serve_stale: FAILURE_RECHECK "-1s"`},
		{"compactcache {\n serve_stale 1h verify x\n}", `serve_stale: VERIFY_TIMEOUT "x"`},
		{"compactcache {\n serve_stale\n serve_stale_policy\n}", "serve_stale_policy: want prefer_positive, got []"},
		{"compactcache {\n servfail -1s\n}", `servfail: "-1s"`},
		{"compactcache {\n servfail 1s 2s\n}", "servfail: want one DURATION, got 2"},
		{"compactcache {\n disable SUCCESS\n}", `disable: "SUCCESS" is not success or denial`},
		// A block after an option that takes none names the option, not
		// the plugin's second use nor the block's first line.
		{"compactcache {\n keepttl {\n }\n}", "keepttl: takes no { } block"},
		{"compactcache {\n capacity 64M {\n x\n }\n}", "capacity: takes no { } block"},
		{"compactcache {\n snapshot /var/cache.snap {\n interval 1m\n }\n}", "snapshot: takes no { } block"},
		{"compactcache {\n serve_stale 1h {\n }\n}", "serve_stale: takes no { } block"},
		{"compactcache {\n ecs {\n add\n } keepttl\n}", `ecs: "keepttl" after its block's }`},
	}
	for _, tc := range tests {
		_, err := parse(caddy.NewTestController("dns", tc.input))
		if err == nil {
			t.Errorf("%q: no error", tc.input)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %q does not contain %q", tc.input, err, tc.want)
		}
	}
}

// TestRefusesTheStockCacheBeside: a block with both caches, a switch half
// made, does not start. (The stock cache is linked in for differential_test.go.)
func TestRefusesTheStockCacheBeside(t *testing.T) {
	corefile := `.:0 {
	bind 127.0.0.1
	cache
	compactcache
	whoami
}`
	err := startError(corefile)
	if err == nil {
		t.Fatal("a block with cache and compactcache started")
	}
	if !strings.Contains(err.Error(), "compactcache replaces it: remove cache") {
		t.Errorf("error %q, want it to say to remove cache", err)
	}
}

// TestRefusesASnapshotPathTwice: blocks that give one snapshot PATH (a block
// copied for a second view) would each read the other's entries after a
// restart, one view's answers served to the other's clients: the second is
// refused at startup, naming the first. Blocks of their own files start.
func TestRefusesASnapshotPathTwice(t *testing.T) {
	dir := t.TempDir()
	corefile := func(second string) string {
		var b strings.Builder
		for i, path := range []string{filepath.Join(dir, "v0.snap"), filepath.Join(dir, second)} {
			fmt.Fprintf(&b, ".:0 {\n\tview v%d {\n\t\texpr client_ip() == '127.0.0.%d'\n\t}\n\tbind 127.0.0.1\n\tcompactcache {\n\t\tsnapshot %s\n\t}\n\twhoami\n}\n", i, i+1, path)
		}
		return b.String()
	}
	err := startError(corefile("v0.snap"))
	if want := filepath.Join(dir, "v0.snap") + " is the file of block dns://.:0 too"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("two views of one snapshot file: error %v, want one saying %q", err, want)
	}
	inst, err := startCorefile(corefile("v1.snap"))
	if err != nil {
		t.Fatalf("two views of their own snapshot files: %v", err)
	}
	stopInstance(inst)
}
