package frontend

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
)

// At a reload the new instance's front end opens its sockets beside the
// old one's (SO_REUSEPORT), and the old one closes once the new instance
// runs. A socket left in its address's SO_REUSEPORT group unread loses
// every datagram the kernel hands it, so once its readers leave, the old
// front end takes its UDP sockets out of their groups, when a newer front
// end has a socket on each of their addresses, answers what waits in them
// and closes them; the chain's replies to requests it read, still in
// flight, leave through that socket instead: from the same address and
// port, which is all the client sees. Its TCP connections, those it serves
// and those waiting in its listeners' queues, it hands to the newer front
// end (handConn). When a reload fails, the new instance's front end closes
// without having started, and the running one, older, takes what waits in
// its sockets instead (running). (CoreDNS's
// own server hands its sockets to the new instance instead; the front end
// opens a set of its own per instance, whose readers start only once the
// old instance's shutdown has run.)

// successors are the open sockets of every front end, by their network and
// local address, the newest last.
var successors = struct {
	sync.Mutex
	m map[string][]openSocket
}{m: map[string][]openSocket{}}

type openSocket struct {
	fe *frontend
	s  udpSender // nil for a TCP listener
}

// recordSocket records a socket of fe on local: s for UDP, nil for a TCP
// listener.
func recordSocket(fe *frontend, local net.Addr, s udpSender) {
	successors.Lock()
	defer successors.Unlock()
	k := socketKey(local)
	successors.m[k] = append(successors.m[k], openSocket{fe, s})
}

func socketKey(local net.Addr) string { return local.Network() + " " + local.String() }

// forgetSockets forgets fe's sockets.
func forgetSockets(fe *frontend) { forget(fe, func(udpSender) bool { return true }) }

// forget forgets the sockets of fe whose sender, nil for a TCP listener,
// of reports.
func forget(fe *frontend, of func(udpSender) bool) {
	successors.Lock()
	defer successors.Unlock()
	for k, socks := range successors.m {
		kept := socks[:0]
		for _, o := range socks {
			if o.fe != fe || !of(o.s) {
				kept = append(kept, o)
			}
		}
		if len(kept) == 0 {
			delete(successors.m, k)
		} else {
			successors.m[k] = kept
		}
	}
}

// successor returns the newest socket on local of a front end opened
// after fe, if any.
func successor(fe *frontend, local net.Addr) (openSocket, bool) {
	if o, ok := newest(local); ok && o.fe.seq > fe.seq {
		return o, true
	}
	return openSocket{}, false
}

// newest returns the newest open socket on local, if any.
func newest(local net.Addr) (openSocket, bool) {
	successors.Lock()
	defer successors.Unlock()
	if socks := successors.m[socketKey(local)]; len(socks) > 0 {
		return socks[len(socks)-1], true
	}
	return openSocket{}, false
}

// running returns the newest front end on local other than fe that has
// started and is not closing, or nil. When a reload fails, the new
// instance's front end closes without having started, beside the running
// one. One closing would only hand on what it is given.
func running(fe *frontend, local net.Addr) *frontend {
	successors.Lock()
	socks := slices.Clone(successors.m[socketKey(local)])
	successors.Unlock()
	for i := len(socks) - 1; i >= 0; i-- {
		o := socks[i].fe
		if o == fe || o.stopping.Load() {
			continue
		}
		o.taken.Lock()
		ok := o.taken.started && !o.taken.closed
		o.taken.Unlock()
		if ok {
			return o
		}
	}
	return nil
}

// frontends numbers the front ends in the order they open.
var frontends atomic.Uint64

// udpSockets are some of a front end's UDP sockets.
type udpSockets struct {
	udp     []*net.UDPConn
	threads []*threadSocket
}

// has reports whether s is one of socks.
func (socks udpSockets) has(s udpSender) bool {
	for _, conn := range socks.udp {
		if s == udpSender(pollerConn{conn}) {
			return true
		}
	}
	for _, t := range socks.threads {
		if s == udpSender(t) {
			return true
		}
	}
	return false
}

// succeededUDP returns fe's UDP sockets on the addresses a newer front end
// has a socket on, all of them for a front end that never started, and
// the others.
func (fe *frontend) succeededUDP() (gone, kept udpSockets) {
	succeeded := func(local net.Addr) bool {
		_, ok := successor(fe, local)
		return ok || fe.server == nil
	}
	for _, conn := range fe.udp {
		if succeeded(conn.LocalAddr()) {
			gone.udp = append(gone.udp, conn)
		} else {
			kept.udp = append(kept.udp, conn)
		}
	}
	for _, s := range fe.threads {
		if succeeded(s.local) {
			gone.threads = append(gone.threads, s)
		} else {
			kept.threads = append(kept.threads, s)
		}
	}
	return gone, kept
}

// handOver has the newest front end opened after fe with a socket on local
// serve what fe read from its sockets as it closed: serve is called with
// that front end once it has started, or with nil should it close first.
// fe's chain is no place for it, as its plugins stop with their instance
// (forward's upstreams, say), and the newer front end starts only once
// they have. handOver reports whether such a front end, not closed, took
// it.
func (fe *frontend) handOver(local net.Addr, serve func(next *frontend)) bool {
	o, ok := successor(fe, local)
	if !ok {
		return false
	}
	next := &o.fe.taken
	next.Lock()
	started, closed := next.started, next.closed
	if !started && !closed {
		next.work = append(next.work, serve)
	}
	next.Unlock()
	if started && !closed {
		serve(o.fe)
	}
	return !closed
}

// taken is what older front ends handed a front end (handOver).
type taken struct {
	sync.Mutex
	started, closed bool
	work            []func(next *frontend) // until it starts
}

// done ends the wait: the front end started, or else closed. It returns
// the work handed to it until then.
func (t *taken) done(started bool) []func(next *frontend) {
	t.Lock()
	defer t.Unlock()
	if started {
		t.started = true
	} else {
		t.closed = true
	}
	work := t.work
	t.work = nil
	return work
}
