package lifecycle

import (
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	_ "github.com/coredns/coredns/plugin/bind"
)

// The test plugin "waits NAME" adds NAME to waiting at its block's startup,
// and gives OnStop a stop of NAME and OnLastStop a last of NAME.
var (
	mu      sync.Mutex
	events  []string
	waiting = New(func(_ *caddy.Instance, name string) { record("start " + name) }, func(name string) { record("stop " + name) })
)

func record(e string) {
	mu.Lock()
	defer mu.Unlock()
	events = append(events, e)
}

// took returns the events since the last call.
func took() []string {
	mu.Lock()
	defer mu.Unlock()
	e := events
	events = nil
	return e
}

func init() {
	plugin.Register("waits", func(c *caddy.Controller) error {
		c.Next()
		args := c.RemainingArgs()
		OnLastStop(c, func() { record("last " + args[0]) })
		OnStop(c, func() { record("stopped " + args[0]) })
		c.OnStartup(func() error {
			waiting.Add(c, args[0])
			record("add " + args[0])
			return nil
		})
		return nil
	})
	dnsserver.Directives = append(dnsserver.Directives, "waits")
}

func input(corefile string) caddy.Input {
	return caddy.CaddyfileInput{Contents: []byte(corefile), ServerTypeName: "dns"}
}

// TestWaiting follows an instance through reloads that fail and succeed:
// what a block added starts once its instance's servers are up, and stops
// when they never come up, by the hook watchRestart gave the running
// instance, whether it has blocks of the plugin or not; what a block gave
// OnStop stops with the instance it replaces, once, and at the process's
// stop, where what it gave OnLastStop comes after, though given before.
func TestWaiting(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, port, _ := net.SplitHostPort(taken.Addr().String())
	block := func(waits string) string { return ".:0 {\n\tbind 127.0.0.1\n\twaits " + waits + "\n}\n" }
	onTakenPort := ".:" + port + " {\n\tbind 127.0.0.1\n}\n"

	inst, err := caddy.Start(input(block("a")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { inst.Stop() }()
	if got, want := took(), []string{"add a", "start a"}; !slices.Equal(got, want) {
		t.Errorf("start: %s, want %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
	for _, tc := range []struct {
		corefile string
		fails    bool
		want     []string
	}{
		{block("b") + onTakenPort, true, []string{"add b", "stop b"}},
		{block("c"), false, []string{"add c", "stopped a", "start c"}},
		{block("d"), false, []string{"add d", "stopped c", "start d"}},
		{block("e") + onTakenPort, true, []string{"add e", "stop e"}},
		// An instance without the plugin (a Corefile switching from
		// cache), whose event hooks after a reload by SIGUSR1 hold none.
		{".:0 {\n\tbind 127.0.0.1\n}\n", false, []string{"stopped d"}},
		{block("g") + onTakenPort, true, []string{"add g", "stop g"}},
		{block("f"), false, []string{"add f", "start f"}},
	} {
		next, err := inst.Restart(input(tc.corefile))
		if (err != nil) != tc.fails {
			t.Fatalf("reload to %q: error %v, want failure %v", tc.corefile, err, tc.fails)
		}
		if err == nil {
			inst = next
		}
		if got := took(); !slices.Equal(got, tc.want) {
			t.Errorf("reload to %q: %s, want %s", tc.corefile, strings.Join(got, ", "), strings.Join(tc.want, ", "))
		}
	}
	// The process's stop: the shutdown callbacks, then the final ones.
	inst.ShutdownCallbacks()
	if got, want := took(), []string{"stopped f", "last f"}; !slices.Equal(got, want) {
		t.Errorf("the process's stop: %s, want %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}
