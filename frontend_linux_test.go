package compactcache

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// inNetns is set in the environment of a test binary that runs one test in a
// network namespace of its own (runInNetns).
const inNetns = "COMPACTCACHE_TEST_IN_NETNS"

// netnsUnusable starts the skip message of a child that cannot configure
// its network namespace.
const netnsUnusable = "the network namespace cannot be configured"

// TestFrontendRepliesFromTheAddressAsked: a front end bound to the
// unspecified address sends each reply from the address its request came to,
// as CoreDNS's own server does. Left to the kernel, the source of a reply is
// the address of the route to the client, which on a host of several
// addresses need not be the one the client asked, and the client drops a
// reply from an address it did not ask. A query to 127.0.0.2 from 127.0.0.1
// shows it: the route to the client gives 127.0.0.1. The test runs in a
// network namespace whose only interface is the loopback, so that the
// unspecified address reaches nothing else.
func TestFrontendRepliesFromTheAddressAsked(t *testing.T) {
	if os.Getenv(inNetns) == "" {
		runInNetns(t)
		return
	}
	upLoopback(t)
	const zone = "source.frontend.test."
	u := upstreamOfA(zone)
	u.add("b."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("b." + zone + " 300 IN A 192.0.2.2")}, nil, nil)
	_, port, err := net.SplitHostPort(freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	startCoreDNS(t, zone+`:0 {
	bind 127.0.0.1
	compactcache {
		frontend udp://0.0.0.0:`+port+`
	}
	forward . `+startUpstream(t, u)+`
}`)
	req := test.Case{Qname: "a." + zone, Qtype: dns.TypeA}.Msg()
	pkt, err := req.Pack()
	if err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"127.0.0.2", "127.0.0.1"} {
		hits, chain := frontendCount(zone, "hit"), frontendCount(zone, "chain")
		// The first query of the name goes through the chain, whose writer
		// sends the reply; the others are the front end's hits.
		for range 2 {
			if exchangeRaw(t, net.JoinHostPort(to, port), pkt, 2*time.Second) == nil {
				t.Fatalf("no reply that a client of %s takes", to)
			}
		}
		chained := frontendCount(zone, "chain") - chain // counted before the chain's reply is sent
		if got := chained + frontendHits(zone, hits, 2-chained); got != 2 {
			t.Errorf("%s: the front end counted %v requests, want 2", to, got)
		}
	}
	if frontendCount(zone, "chain") != 1 {
		t.Errorf("%v requests through the chain, want the first one", frontendCount(zone, "chain"))
	}

	// No reply can leave from a broadcast address: a request to one gets its
	// reply from the routing's source, as before the front end named sources.
	client, err := (&net.ListenConfig{Control: allowBroadcast}).ListenPacket(t.Context(), "udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	broadcast := &net.UDPAddr{IP: net.IPv4(127, 255, 255, 255), Port: atoi(t, port)}
	other, err := test.Case{Qname: "b." + zone, Qtype: dns.TypeA}.Msg().Pack()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, dns.MaxMsgSize)
	for _, path := range []string{"chain", "hit"} {
		if _, err := client.WriteTo(other, broadcast); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, from, err := client.ReadFrom(buf); err != nil {
			t.Errorf("%s: no reply to a request to %s: %v", path, broadcast, err)
		} else {
			t.Logf("%s: the reply to a request to %s came from %s", path, broadcast, from)
		}
	}
}

func allowBroadcast(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// runInNetns runs t again, alone, in a child process in a network namespace
// of its own: with a user namespace of its own too where this process is
// not root.
func runInNetns(t *testing.T) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), inNetns+"=1")
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if uid := os.Getuid(); uid != 0 {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil && bytes.Contains(out, []byte(netnsUnusable)):
		t.Skipf("in a network namespace of its own:\n%s", out)
	case err == nil:
		t.Logf("in a network namespace of its own:\n%s", out)
	case errors.As(err, &exit):
		t.Fatalf("in a network namespace of its own: %v\n%s", err, out)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENOSPC):
		// Where the kernel or a container gives no namespaces: nothing was
		// tested, and the wildcard address must not be bound outside one.
		t.Skipf("no network namespace can be made here: %v", err)
	default:
		t.Fatal(err)
	}
}

// upLoopback brings up the loopback interface of a new network namespace,
// which starts down.
func upLoopback(t *testing.T) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); errors.Is(err, unix.EPERM) {
		// A namespace made but not ours to configure, as where a security
		// module restricts unprivileged ones.
		t.Skipf("%s: bringing up lo: %v", netnsUnusable, err)
	} else if err != nil {
		t.Fatalf("bringing up lo: %v", err)
	}
	if ifaces, err := net.Interfaces(); err != nil || len(ifaces) != 1 {
		t.Fatalf("interfaces %v (%v), want the loopback alone", ifaces, err)
	}
}
