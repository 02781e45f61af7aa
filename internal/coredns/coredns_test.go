package coredns

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/loadbalance"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/nonwriter"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// opcodeTest is a directive whose setup allows UPDATE, as dynupdate's does.
func init() {
	plugin.Register("opcodetest", func(c *caddy.Controller) error {
		c.Next()
		dnsserver.GetConfig(c).AllowOpcode(dns.OpcodeUpdate)
		return nil
	})
	dnsserver.Directives = append(dnsserver.Directives, "opcodetest")
	plugin.Register("portstest", func(c *caddy.Controller) error {
		c.Next()
		portsSeen[c.ServerBlockIndex] = Ports(c)
		return nil
	})
	dnsserver.Directives = append(dnsserver.Directives, "portstest")
}

// portsSeen are the ports the setup of portstest found, by block.
var portsSeen = map[int][]string{}

// TestPorts: the ports of every key of a block, the default one where a
// key has none, though caddy sets the block up for its first key alone.
func TestPorts(t *testing.T) {
	err := caddy.ValidateAndExecuteDirectives(corefile(".:5353 dns://example.org:53 tls://example.net:853 {\n\tportstest\n}\nexample.com {\n\tportstest\n}\nexample.com:1053 example.org:1053 {\n\tportstest\n}\n"), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int][]string{0: {"53", "5353", "853"}, 1: {dnsserver.Port}, 2: {"1053"}}
	if !reflect.DeepEqual(portsSeen, want) {
		t.Errorf("ports of the blocks: %v, want %v", portsSeen, want)
	}
}

// TestFieldsRead fails, naming the field, when CoreDNS or caddy renames or
// retypes a field this package reads.
func TestFieldsRead(t *testing.T) {
	f, ok := reflect.TypeOf(caddy.ServerListener{}).FieldByName(listenerServerField)
	if !ok || f.Type != reflect.TypeOf((*caddy.Server)(nil)).Elem() {
		t.Errorf("caddy.ServerListener has no field %q of type caddy.Server: Server finds no server, and the front end cannot start", listenerServerField)
	}
	f, ok = reflect.TypeOf(dnsserver.Server{}).FieldByName(serverOpcodesField)
	if !ok || f.Type.Kind() != reflect.Map || f.Type.Key().Kind() != reflect.Int {
		t.Errorf("dnsserver.Server has no map field %q keyed by int: AllowedOpcodes reads nothing, and the front end refuses opcodes the server accepts", serverOpcodesField)
	}
	f, ok = reflect.TypeOf(dnsserver.Server{}).FieldByName(serverZonesField)
	if !ok || f.Type.Kind() != reflect.Map || f.Type.Key().Kind() != reflect.String {
		t.Errorf("dnsserver.Server has no map field %q keyed by string: ServerZones reads nothing, and the front end answers names of blocks without it", serverZonesField)
	}
	if pluginWriterType == nil || pluginWriterType.Kind() != reflect.Pointer || pluginWriterType.Elem().Kind() != reflect.Struct {
		t.Fatalf("plugin.NextOrFailure's writer is %v, not a pointer to a struct", pluginWriterType)
	}
	inner := pluginWriterType.Elem().Field(pluginWriterInnerName)
	if inner.Type != reflect.TypeOf((*dns.ResponseWriter)(nil)).Elem() {
		t.Errorf("plugin.NextOrFailure's writer holds %v in field %d, not the dns.ResponseWriter it wraps: Nested cannot see through it", inner.Type, pluginWriterInnerName)
	}
}

// TestNested sees a nested lookup's writer through the wrappers of the
// server and of every plugin before the cache, and a client's as none.
func TestNested(t *testing.T) {
	var seen []bool
	probe := plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		seen = append(seen, Nested(w))
		return 0, nil
	})
	client := &test.ResponseWriter{}
	for _, w := range []dns.ResponseWriter{client, nonwriter.New(client)} {
		probe.ServeDNS(context.Background(), w, nil)
		probe.ServeDNS(context.Background(), request.NewScrubWriter(new(dns.Msg), w), nil)
		plugin.NextOrFailure("", probe, context.Background(), w, nil)
		plugin.NextOrFailure("", plugin.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
			return plugin.NextOrFailure("", probe, ctx, w, r)
		}), context.Background(), request.NewScrubWriter(new(dns.Msg), w), nil)
		// prometheus's and loadbalance's writers, before the cache.
		plugin.NextOrFailure("", probe, context.Background(), &loadbalance.LoadBalanceResponseWriter{ResponseWriter: metrics.NewRecorder(request.NewScrubWriter(new(dns.Msg), w))}, nil)
	}
	want := []bool{false, false, false, false, false, true, true, true, true, true}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("Nested: %v, want %v", seen, want)
	}
}

// TestServerAndOpcodes finds a running instance's server by its address
// and reads the opcodes its plugins allow.
func TestServerAndOpcodes(t *testing.T) {
	dnsserver.Quiet = true
	inst, err := caddy.Start(corefile(".:0 {\n\tbind 127.0.0.1\n\twhoami\n}\nupdate.example.:0 {\n\tbind ::1\n\topcodetest\n\twhoami\n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	srv := Server(inst, []string{"dns://127.0.0.1:0"})
	if srv == nil {
		t.Fatal("Server found no server for dns://127.0.0.1:0")
	}
	if Server(inst, []string{"dns://127.0.0.1:1"}) != nil {
		t.Error("Server found a server for an address nobody listens on")
	}
	if ops := AllowedOpcodes(srv); ops != [16]bool{} {
		t.Errorf("AllowedOpcodes of a block of whoami: %v, want none", ops)
	}
	if zones := ServerZones(srv); !slices.Equal(zones, []string{"."}) {
		t.Errorf("ServerZones of the server of .: %v, want [.]", zones)
	}
	// The first of the addresses that has a server decides, whatever order
	// the instance keeps its servers in.
	for _, tc := range []struct {
		addrs []string
		want  string
	}{
		{[]string{"dns://127.0.0.1:0", "dns://[::1]:0"}, "dns://127.0.0.1:0"},
		{[]string{"dns://[::1]:0", "dns://127.0.0.1:0"}, "dns://[::1]:0"},
		{[]string{"dns://127.0.0.1:1", "dns://[::1]:0"}, "dns://[::1]:0"},
	} {
		if s := Server(inst, tc.addrs); s == nil {
			t.Errorf("Server(%v) found none, want the server of %s", tc.addrs, tc.want)
		} else if s.Addr != tc.want {
			t.Errorf("Server(%v) found the server of %s, want the server of %s", tc.addrs, s.Addr, tc.want)
		}
	}
	var want [16]bool
	want[dns.OpcodeUpdate] = true
	if srv := Server(inst, []string{"dns://[::1]:0"}); srv == nil {
		t.Error("Server found no server for dns://[::1]:0")
	} else if ops := AllowedOpcodes(srv); ops != want {
		t.Errorf("AllowedOpcodes of a block that allows UPDATE: %v, want %v", ops, want)
	}
}

type corefile string

func (c corefile) Body() []byte       { return []byte(c) }
func (c corefile) Path() string       { return "Corefile" }
func (c corefile) ServerType() string { return "dns" }

// TestRoundRobin sets up loadbalance as a Corefile does and tells its
// policies apart: round_robin (the default) is the writer's to apply; the
// weighted policy and prefer are not.
func TestRoundRobin(t *testing.T) {
	weights := filepath.Join(t.TempDir(), "weights")
	if err := os.WriteFile(weights, []byte("www.example.org\n192.0.2.1 10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	setup, err := caddy.DirectiveAction("dns", "loadbalance")
	if err != nil {
		t.Fatalf("loadbalance is not registered: %v", err)
	}
	for _, tc := range []struct {
		input string
		want  bool
	}{
		{"loadbalance", true},
		{"loadbalance round_robin", true},
		{"loadbalance round_robin {\n prefer 10.0.0.0/8\n}", false},
		{"loadbalance weighted " + weights, false},
	} {
		c := caddy.NewTestController("dns", tc.input)
		if err := setup(c); err != nil {
			t.Fatalf("%q: %v", tc.input, err)
		}
		plugins := dnsserver.GetConfig(c).Plugin
		if len(plugins) != 1 {
			t.Fatalf("%q: %d plugins", tc.input, len(plugins))
		}
		h := plugins[0](nil)
		if got := RoundRobin(h); got != tc.want {
			t.Errorf("%q: RoundRobin %v, want %v (loadbalance.LoadBalance's %q or its round_robin function %s renamed?)", tc.input, got, tc.want, shuffleField, randomShuffle)
		}
	}
	if RoundRobin(plugin.HandlerFunc(nil)) {
		t.Error("RoundRobin of a handler that is not loadbalance")
	}
}
