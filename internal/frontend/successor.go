package frontend

import (
	"net"
	"sync"
	"sync/atomic"
)

// At a reload the new instance's front end opens its sockets beside the
// old one's (SO_REUSEPORT), and the old one closes once the new instance
// runs. A socket left in its address's SO_REUSEPORT group unread loses
// every datagram the kernel hands it, so the old front end closes its UDP
// sockets as soon as its readers leave, when a newer front end has a
// socket on each of their addresses, and the chain's replies to requests
// it read, still in flight, leave through that socket instead: from the
// same address and port, which is all the client sees. (CoreDNS's own
// server hands its socket to the new instance instead; the front end opens
// a set of its own per instance, and datagrams that reach the old set
// between its readers' last read and its close are lost.)

// successors are the open UDP sockets of every front end, by their local
// address, the newest last.
var successors = struct {
	sync.Mutex
	m map[string][]openSocket
}{m: map[string][]openSocket{}}

type openSocket struct {
	fe *frontend
	s  udpSender
}

// recordSocket records s, a UDP socket of fe on local.
func recordSocket(fe *frontend, local net.Addr, s udpSender) {
	successors.Lock()
	defer successors.Unlock()
	k := local.String()
	successors.m[k] = append(successors.m[k], openSocket{fe, s})
}

// forgetSockets forgets fe's UDP sockets.
func forgetSockets(fe *frontend) {
	successors.Lock()
	defer successors.Unlock()
	for k, socks := range successors.m {
		kept := socks[:0]
		for _, o := range socks {
			if o.fe != fe {
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
// after fe, or nil.
func successor(fe *frontend, local net.Addr) udpSender {
	successors.Lock()
	defer successors.Unlock()
	socks := successors.m[local.String()]
	if n := len(socks); n > 0 && socks[n-1].fe.seq > fe.seq {
		return socks[n-1].s
	}
	return nil
}

// frontends numbers the front ends in the order they open.
var frontends atomic.Uint64

// succeeded reports whether a newer front end has a socket on every
// address fe has UDP sockets on.
func (fe *frontend) succeeded() bool {
	for _, local := range fe.udpAddrs() {
		if successor(fe, local) == nil {
			return false
		}
	}
	return true
}

// udpAddrs returns the local addresses of fe's UDP sockets.
func (fe *frontend) udpAddrs() []net.Addr {
	var addrs []net.Addr
	for _, conn := range fe.udp {
		addrs = append(addrs, conn.LocalAddr())
	}
	for _, s := range fe.threads {
		addrs = append(addrs, s.local)
	}
	return addrs
}
