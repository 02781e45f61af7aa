// Package coredns reads the parts of CoreDNS's and caddy's state that they
// do not export and compactcache needs: the ports of a block's servers,
// the server behind a caddy listener, the opcodes a server accepts and the
// zones of its blocks, and the writer plugin.NextOrFailure wraps around the
// next plugin's. Each read goes through reflect here and nowhere else, and
// each has a test (coredns_test.go) that fails, naming the field, when a
// CoreDNS version renames or retypes what it reads.
package coredns

import (
	"context"
	"net"
	"reflect"
	"runtime"
	"slices"
	"unsafe"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/loadbalance"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/nonwriter"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
)

// What is read, by name: the tests check each.
const (
	listenerServerField   = "server"         // caddy.ServerListener
	serverOpcodesField    = "allowedOpcodes" // dnsserver.Server
	serverZonesField      = "zones"          // dnsserver.Server
	pluginWriterInnerName = 0                // the field of NextOrFailure's writer that holds the wrapped one
	shuffleField          = "shuffle"        // loadbalance.LoadBalance
	// randomShuffle is loadbalance's round_robin policy, without prefer.
	randomShuffle = "github.com/coredns/coredns/plugin/loadbalance.randomShuffle"
)

// ServerAddrs returns the addresses dnsserver gives the servers of c's
// block (dns://host:port), by which Server finds them and under which they
// count: the first key's first. caddy sets a block up for its first key
// alone, whose listen hosts dnsserver gives the others; each key keeps its
// own transport and port, and a block whose keys have several serves them
// all with the one instance.
func ServerAddrs(c *caddy.Controller) []string {
	first := dnsserver.GetConfig(c)
	var addrs []string
	for i := range max(1, len(c.ServerBlockKeys)) { // a test's controller may have no keys
		k := *c
		k.ServerBlockKeyIndex = i
		cfg := dnsserver.GetConfig(&k)
		for _, h := range first.ListenHosts {
			if a := cfg.Transport + "://" + net.JoinHostPort(h, cfg.Port); !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	return addrs
}

// Ports returns the ports of the servers of c's block, each once, sorted.
// caddy sets a block up for its first key alone; dnsserver keeps a config
// of each key, with its port, under the key's index.
func Ports(c *caddy.Controller) []string {
	var ports []string
	for i := range c.ServerBlockKeys {
		k := *c
		k.ServerBlockKeyIndex = i
		ports = append(ports, dnsserver.GetConfig(&k).Port)
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// Server returns the instance's server listening on the first of addrs, as
// dnsserver names them (dns://host:port), that has one, or nil. caddy keeps
// the servers in an unexported field of ServerListener, and a front end must
// hand requests to the server itself. The order of addrs decides, not the
// instance's, which dnsserver builds from a map: a block bound to several
// addresses must label its front end's series with the same server on
// every start.
func Server(inst *caddy.Instance, addrs []string) *dnsserver.Server {
	byAddr := map[string]*dnsserver.Server{}
	for _, sl := range inst.Servers() {
		f := reflect.ValueOf(&sl).Elem().FieldByName(listenerServerField)
		if !f.IsValid() {
			return nil
		}
		if s, ok := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(*dnsserver.Server); ok {
			byAddr[s.Addr] = s
		}
	}
	for _, a := range addrs {
		if s := byAddr[a]; s != nil {
			return s
		}
	}
	return nil
}

// ServerZones returns the zones of srv's blocks, as the server keys them,
// by which it gives each request to a block.
func ServerZones(srv *dnsserver.Server) []string {
	m := reflect.ValueOf(srv).Elem().FieldByName(serverZonesField)
	if m.Kind() != reflect.Map || m.Type().Key().Kind() != reflect.String {
		return nil
	}
	zones := make([]string, 0, m.Len())
	for _, k := range m.MapKeys() {
		zones = append(zones, k.String())
	}
	return zones
}

// AllowedOpcodes returns the opcodes srv accepts besides QUERY and NOTIFY,
// which its plugins asked for.
func AllowedOpcodes(srv *dnsserver.Server) [16]bool {
	var ok [16]bool
	m := reflect.ValueOf(srv).Elem().FieldByName(serverOpcodesField)
	if m.Kind() != reflect.Map {
		return ok
	}
	for _, k := range m.MapKeys() {
		if op := k.Int(); op >= 0 && op < int64(len(ok)) {
			ok[op] = true
		}
	}
	return ok
}

// RoundRobin reports whether h, the loadbalance plugin, shuffles replies
// with its round_robin policy and nothing else: a random order of the
// address and of the MX records of each section, regrouped as CNAME, other,
// address, MX, which a reply writer can apply itself. The weighted policy
// and prefer's subnets only the plugin can. The policy is an unexported
// function value; its name says which.
func RoundRobin(h plugin.Handler) bool {
	v := reflect.ValueOf(h)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return false
	}
	f := v.FieldByName(shuffleField)
	if f.Kind() != reflect.Func || f.IsNil() {
		return false
	}
	fn := runtime.FuncForPC(f.Pointer())
	return fn != nil && fn.Name() == randomShuffle
}

// Nested reports whether w belongs to a nested lookup (autopath, dns64,
// kubernetes ExternalName, file's out-of-zone CNAME targets): such lookups
// run the chain with a nonwriter.Writer, whose Write would go straight to the
// original client. Nested sees through the writers Inner knows.
func Nested(w dns.ResponseWriter) bool {
	for ; w != nil; w = Inner(w) {
		if _, ok := w.(*nonwriter.Writer); ok {
			return true
		}
	}
	return false
}

// Inner returns the writer w wraps, for the writers that stand between the
// server and the cache in a cluster's Corefile: the server's ScrubWriter,
// plugin.NextOrFailure's unexported writer (one per plugin before the
// cache), and the writers of prometheus and loadbalance; nil for any other.
func Inner(w dns.ResponseWriter) dns.ResponseWriter {
	switch t := w.(type) {
	case *request.ScrubWriter:
		return t.ResponseWriter
	case *metrics.Recorder:
		return t.ResponseWriter
	case *loadbalance.LoadBalanceResponseWriter:
		return t.ResponseWriter
	}
	if inner, ok := unwrap(w); ok {
		return inner
	}
	return nil
}

// unwrap returns the writer that w, the writer plugin.NextOrFailure wraps
// around the next plugin's, holds, and true; or w and false for any other
// writer. Writing to the writer it returns skips only w, which tells a
// plugin.PluginTracker directly inside it the next plugin's name.
func unwrap(w dns.ResponseWriter) (dns.ResponseWriter, bool) {
	if reflect.TypeOf(w) != pluginWriterType {
		return w, false
	}
	return reflect.ValueOf(w).Elem().Field(pluginWriterInnerName).Interface().(dns.ResponseWriter), true
}

// pluginWriterType is the type of the writer plugin.NextOrFailure hands the
// next plugin, learnt from NextOrFailure itself since it is not exported.
var pluginWriterType = func() reflect.Type {
	var t reflect.Type
	plugin.NextOrFailure("", plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, _ *dns.Msg) (int, error) {
		t = reflect.TypeOf(w)
		return 0, nil
	}), context.Background(), NoClient, nil)
	return t
}()

// NoClient is the ResponseWriter of requests no client waits for: the
// cache's background fetches, and the call that learns pluginWriterType.
// Its writes go nowhere. It presents itself as a TCP client, so that
// upstream replies to it are not truncated.
var NoClient dns.ResponseWriter = noClient{}

type noClient struct{}

var noClientAddr = &net.TCPAddr{IP: net.IPv6loopback}

func (noClient) LocalAddr() net.Addr         { return noClientAddr }
func (noClient) RemoteAddr() net.Addr        { return noClientAddr }
func (noClient) WriteMsg(*dns.Msg) error     { return nil }
func (noClient) Write(b []byte) (int, error) { return len(b), nil }
func (noClient) Close() error                { return nil }
func (noClient) TsigStatus() error           { return nil }
func (noClient) TsigTimersOnly(bool)         {}
func (noClient) Hijack()                     {}
